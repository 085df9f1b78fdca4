# tiny_math: the embedded tiny-skills model's NeMo-Skills benchmark (examples/embedded/train_skills.py)
METRICS_TYPE = "math"
GENERATION_ARGS = "++prompt_config=generic/math ++eval_type=math"
