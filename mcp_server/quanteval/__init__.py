"""quanteval: evaluate the accuracy of quantized LLM checkpoints with NeMo Evaluator Launcher."""

__version__ = "0.1.0"
