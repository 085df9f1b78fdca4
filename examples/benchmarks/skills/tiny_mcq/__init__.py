# tiny_mcq: the embedded tiny-skills model's NeMo-Skills benchmark (examples/embedded/train_skills.py)
DATASET_GROUP = "multichoice"
METRICS_TYPE = "multichoice"
EVAL_ARGS = "++eval_type=multichoice"
GENERATION_ARGS = "++prompt_config=eval/aai/mcq-4choices-boxed"
