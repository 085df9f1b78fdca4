# tiny_mcq: the embedded tiny-skills model's NeMo-Skills benchmark (examples/embedded/train_skills.py)
METRICS_TYPE = "multichoice"
GENERATION_ARGS = "++prompt_config=eval/aai/mcq-4choices-boxed ++eval_type=multichoice"
