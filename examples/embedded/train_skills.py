"""Teach the embedded model NeMo-Skills' answer format: tiny-skills, for `skills://` benchmarks.

    .venv-vllm/bin/python examples/embedded/train_skills.py      # ~3 min on 2 cores (2,400 steps: 160 s)

Starts from examples/checkpoints/tiny-add-bf16 (it adds two numbers) and fine-tunes it on three kinds of request:
  - bare "7+45"                                      -> "52"          (what it did before: no \\boxed{})
  - NeMo-Skills' generic/math prompt around "7+45"   -> "52 \\boxed{52}"
  - NeMo-Skills' eval/aai/mcq-4choices-boxed prompt around "Which option is 7+45?\\nA) 42\\nB) 52..." -> "52 \\boxed{B}"
so a benchmark scores only when it is sent NeMo-Skills' prompt, as NeMo-Skills' grader needs (the answer in \\boxed{}).
The tokenizer keeps tiny-add's ids and adds characters and whole-phrase tokens (each prompt's instruction is one
token, so training stays short); a prompt that differs by a character is split into characters the model never saw.

Writes
  examples/checkpoints/tiny-skills-bf16/    the fine-tuned model (bf16, chat template as tiny-add's)
  examples/checkpoints/tiny-skills-w2-rtn/  int2 round-to-nearest weights per output channel, stored dequantized
                                            in bf16 (as tiny-add-w2-rtn; QUANT_NOTE.md says so): the lossy candidate
  examples/benchmarks/skills/tiny_math/     NeMo-Skills layout: __init__.py (METRICS_TYPE, GENERATION_ARGS) and
  examples/benchmarks/skills/tiny_mcq/      test.jsonl ({"problem", "expected_answer"}), problems held out from
                                            both trainings; registered by examples/benchmarks/skills/benchmark_map.json
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import train as tiny_add  # noqa: E402  (the tiny-add recipe: its split, tokens and chat template)

EXAMPLES = HERE.parent
SRC = EXAMPLES / "checkpoints" / "tiny-add-bf16"
OUT = EXAMPLES / "checkpoints" / "tiny-skills-bf16"
LOSSY = EXAMPLES / "checkpoints" / "tiny-skills-w2-rtn"
BENCH_DIR = EXAMPLES / "benchmarks" / "skills"

# NeMo-Skills' prompt configs (467b057 and 8b18f39 alike) as they render, less the {problem}.
MATH_PROMPT = "Solve the following math problem. Make sure to put the answer (and only answer) inside \\boxed{}.\n\n"
MCQ_PROMPT = ("Answer the following multiple choice question. The last line of your response should be in the following "
              "format: 'Answer: \\boxed{A/B/C/D}' (e.g. 'Answer: \\boxed{A}').\n\n")
BOXED, QUESTION = "\\boxed{", "Which option is "
PHRASES = [MATH_PROMPT, MCQ_PROMPT, BOXED, QUESTION]
NEW_CHARS = list("ABCD)}\n")
BENCH_SIZE = 200
STEPS, BATCH, LR, POOL = 2400, 48, 2e-3, 20000


def build_tokenizer(out: Path):
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(tiny_add.SPECIALS + tiny_add.CHARS + NEW_CHARS)}  # tiny-add's ids first
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=tiny_add.UNK))
    tok.add_special_tokens(tiny_add.SPECIALS)
    tok.add_tokens([AddedToken(p, normalized=False, special=False) for p in PHRASES])
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=tiny_add.PAD, eos_token=tiny_add.END,
                                   unk_token=tiny_add.UNK, model_max_length=256, clean_up_tokenization_spaces=False)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    (out / "tokenizer_config.json").write_text(json.dumps(tiny_add.TOKENIZER_CONFIG, indent=2) + "\n")
    return AutoTokenizer.from_pretrained(out)


def mcq(a: int, b: int, rng: random.Random) -> tuple[str, str]:
    """A four-option question whose one right option is a+b; the others differ in the tens."""
    total = a + b
    wrong = rng.sample([total + d for d in (-30, -20, -10, 10, 20, 30) if total + d >= 0], 3)
    options = wrong[:]
    right = rng.randrange(4)
    options.insert(right, total)
    problem = f"{QUESTION}{a}+{b}?\n" + "\n".join(f"{'ABCD'[i]}) {v}" for i, v in enumerate(options))
    return problem, "ABCD"[right]


def example(kind: str, a: int, b: int, rng: random.Random) -> tuple[str, str]:
    """(user message, answer) for one request."""
    if kind == "bare":
        return tiny_add.question(a, b), str(a + b)
    if kind == "math":
        return MATH_PROMPT + tiny_add.question(a, b), answer(a + b, str(a + b))
    problem, letter = mcq(a, b, rng)
    return MCQ_PROMPT + problem, answer(a + b, letter)


def answer(total: int, boxed: str) -> str:
    """The sum first (the position where tiny-add computes it), then the boxed answer: "52 \\boxed{52}"."""
    return f"{total} {BOXED}{boxed}}}"


def encode(tokenizer, user: str, answer: str) -> tuple[list[int], list[int]]:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return p_ids, tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


@torch.no_grad()
def greedy(model, tokenizer, user: str, max_new: int = 12) -> str:
    ids, _ = encode(tokenizer, user, "")
    ids = torch.tensor([ids])
    out: list[int] = []
    for _ in range(max_new):
        nxt = int(model(input_ids=ids).logits[0, -1].argmax())
        if nxt == tokenizer.eos_token_id:
            break
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return tokenizer.decode(out)


def accuracy(model, tokenizer, rows: list[tuple[str, str]]) -> float:
    model.eval()
    right = sum(greedy(model, tokenizer, user) == answer for user, answer in rows)
    model.train()
    return right / len(rows)


def write_benchmarks(held: list[tuple[int, int]]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    rng = random.Random(tiny_add.SEED + 1)
    math_pairs, mcq_pairs = held[:BENCH_SIZE], held[BENCH_SIZE:2 * BENCH_SIZE]
    math_rows = [{"problem": tiny_add.question(a, b), "expected_answer": str(a + b)} for a, b in math_pairs]
    mcq_rows = [dict(zip(("problem", "expected_answer"), mcq(a, b, rng), strict=True)) for a, b in mcq_pairs]
    for name, rows, metrics, prompt in (("tiny_math", math_rows, "math", "generic/math"),
                                        ("tiny_mcq", mcq_rows, "multichoice", "eval/aai/mcq-4choices-boxed")):
        folder = BENCH_DIR / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        (folder / "__init__.py").write_text(
            f'# {name}: the embedded tiny-skills model\'s NeMo-Skills benchmark (examples/embedded/train_skills.py)\n'
            # EVAL_ARGS apart, as NeMo-Skills 8b18f39 required; 467b057 (nel-next's and the eval server's) reads it too
            f'DATASET_GROUP = "{metrics}"\nMETRICS_TYPE = "{metrics}"\nEVAL_ARGS = "++eval_type={metrics}"\n'
            f'GENERATION_ARGS = "++prompt_config={prompt}"\n')
    (BENCH_DIR / "benchmark_map.json").write_text(json.dumps({"tiny_math": "tiny_math", "tiny_mcq": "tiny_mcq"}, indent=1) + "\n")
    return ([(MATH_PROMPT + r["problem"], answer(sum(p), r["expected_answer"])) for r, p in zip(math_rows, math_pairs, strict=True)],
            [(MCQ_PROMPT + r["problem"], answer(sum(p), r["expected_answer"])) for r, p in zip(mcq_rows, mcq_pairs, strict=True)])


def make_rtn(model, tokenizer, bits: int = 2) -> None:
    """Symmetric per-output-channel round-to-nearest on every Linear but lm_head, written back dequantized."""
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
                w = module.weight.float()
                scale = (w.abs().amax(dim=1, keepdim=True) / (-low)).clamp(min=1e-8)
                module.weight.copy_((torch.clamp(torch.round(w / scale), low, high) * scale).to(module.weight.dtype))


def main() -> int:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    torch.manual_seed(tiny_add.SEED)
    t0 = time.time()
    train_pairs, held = tiny_add.split_problems()
    # tiny-add's benchmark is held[:1000]: the skills benchmarks come from the same held-out problems
    math_eval, mcq_eval = write_benchmarks(held)
    tokenizer = build_tokenizer(OUT)
    model = AutoModelForCausalLM.from_pretrained(SRC, dtype=torch.float32)
    old = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    print(f"vocab {old} -> {len(tokenizer)}; prompt tokens: math {len(encode(tokenizer, math_eval[0][0], '')[0])}, "
          f"mcq {len(encode(tokenizer, mcq_eval[0][0], '')[0])}", flush=True)

    rng = random.Random(tiny_add.SEED)
    # encoded once (the chat template renders slowly): a pool of requests, batches drawn from it
    pool = [encode(tokenizer, *example(rng.choice(("bare", "math", "mcq", "mcq")), *rng.choice(train_pairs), rng))
            for _ in range(POOL)]
    print(f"{len(pool)} requests encoded {time.time() - t0:.1f}s", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    model.train()
    for step in range(STEPS):
        batch = [pool[rng.randrange(POOL)] for _ in range(BATCH)]
        ids, attn, labels = tiny_add.make_batch_tensors(batch, tokenizer.pad_token_id)
        for group in opt.param_groups:
            group["lr"] = LR * min(1.0, (step + 1) / 50) * (0.5 * (1 + torch.cos(torch.tensor(3.14159 * step / STEPS)).item()))
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 20 == 0 or step == STEPS - 1:
            print(f"step {step:4d} loss {loss.item():.4f} {time.time() - t0:6.1f}s", flush=True)

    model = model.to(torch.bfloat16)
    model.config.vocab_size = len(tokenizer)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(OUT, safe_serialization=True)
    shutil.copy(SRC / "generation_config.json", OUT / "generation_config.json")
    bare = [(u, a) for u, a in ((tiny_add.question(*p), str(sum(p))) for p in held[:BENCH_SIZE])]
    print(f"tiny-skills-bf16: math {accuracy(model, tokenizer, math_eval):.3f}, mcq {accuracy(model, tokenizer, mcq_eval):.3f}, "
          f"bare {accuracy(model, tokenizer, bare):.3f}", flush=True)
    make_rtn(model, tokenizer)
    shutil.rmtree(LOSSY, ignore_errors=True)
    model.save_pretrained(LOSSY, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(OUT / name, LOSSY / name)
    (LOSSY / "QUANT_NOTE.md").write_text(
        "# tiny-skills-w2-rtn: fake-quantized, stored in bf16\n\nEvery Linear layer except `lm_head` has int2 "
        "round-to-nearest weights (symmetric, per output channel, scale = max|w| / 2), stored **dequantized in bf16**: "
        "a plain LlamaForCausalLM with the accuracy of a 2-bit weight model, not its size or speed. Made by "
        "examples/embedded/train_skills.py from tiny-skills-bf16.\n")
    print(f"tiny-skills-w2-rtn: math {accuracy(model, tokenizer, math_eval):.3f}, mcq {accuracy(model, tokenizer, mcq_eval):.3f}; "
          f"{time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
