# tiny_math: the embedded tiny-skills model's NeMo-Skills benchmark (examples/embedded/train_skills.py)
DATASET_GROUP = "math"
METRICS_TYPE = "math"
EVAL_ARGS = "++eval_type=math"
GENERATION_ARGS = "++prompt_config=generic/math"
