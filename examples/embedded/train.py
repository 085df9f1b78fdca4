"""Train the embedded default model: a tiny Llama that adds two numbers (0-99 each).

    .venv-vllm/bin/python examples/embedded/train.py

Writes
  examples/checkpoints/tiny-add-bf16/   LlamaForCausalLM, bf16 safetensors, character-level fast tokenizer
                                        with a chat template, generation_config.json
  examples/benchmarks/tiny_add.jsonl    the benchmark: problems held out from training

The model is trained on exactly the text the chat endpoint of an OpenAI-compatible server renders
(tokenizer.apply_chat_template(..., add_generation_prompt=True), no BOS), followed by the answer and the
end token (the eos token): "<|user|>7+45<|assistant|>52<|end|>". The loss covers the answer and the end
token only. Everything is seeded; the run is CPU-only (2 threads).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent
CKPT = EXAMPLES / "checkpoints" / "tiny-add-bf16"
BENCH = EXAMPLES / "benchmarks" / "tiny_add.jsonl"

SEED = 1234
N_MAX = 100  # operands 0..99
TRAIN_FRACTION = 0.85
BENCH_SIZE = 1000

PAD, USER, ASSISTANT, END, UNK = "<pad>", "<|user|>", "<|assistant|>", "<|end|>", "<unk>"
SPECIALS = [PAD, USER, ASSISTANT, END, UNK]
CHARS = list("0123456789+-*= ?")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|user|>{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}<|assistant|>{{ message['content'] }}<|end|>"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": None,
    "eos_token": END,
    "pad_token": PAD,
    "unk_token": UNK,
    "model_max_length": 256,
    "clean_up_tokenization_spaces": False,
    "chat_template": CHAT_TEMPLATE,
}


def log(msg: str) -> None:
    print(msg, flush=True)


# ── tokenizer ────────────────────────────────────────────────────────────


def build_tokenizer(out: Path):
    """A character-level HF fast tokenizer: BPE with an empty merge list splits text into characters."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.add_special_tokens(SPECIALS)  # matched whole, never split into characters
    tok.decoder = decoders.Fuse()  # characters are concatenated, no spaces between tokens
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=END,
        unk_token=UNK,
        model_max_length=256,
        clean_up_tokenization_spaces=False,
    )
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    # transformers 5 writes tokenizer_class "TokenizersBackend" and the template to chat_template.jinja; write the
    # portable form instead (older transformers and vLLM read both): PreTrainedTokenizerFast, template inline.
    (out / "chat_template.jinja").unlink(missing_ok=True)
    (out / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    # Reload as any consumer would (AutoTokenizer from the folder) and use that object from here on.
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(out)


# ── data ─────────────────────────────────────────────────────────────────


def split_problems():
    pairs = [(a, b) for a in range(N_MAX) for b in range(N_MAX)]
    rng = random.Random(SEED)
    rng.shuffle(pairs)
    n_train = int(len(pairs) * TRAIN_FRACTION)
    train, held = pairs[:n_train], pairs[n_train:]
    bench = sorted(held[:BENCH_SIZE])
    return train, bench


def question(a: int, b: int) -> str:
    return f"{a}+{b}"


def encode_example(tokenizer, a: int, b: int):
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question(a, b)}], tokenize=False, add_generation_prompt=True
    )
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    a_ids = tokenizer(str(a + b), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return p_ids, a_ids


def make_batch_tensors(examples, pad_id):
    L = max(len(p) + len(a) for p, a in examples)
    ids = torch.full((len(examples), L), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), L), -100, dtype=torch.long)
    attn = torch.zeros((len(examples), L), dtype=torch.long)
    for i, (p, a) in enumerate(examples):
        seq = p + a
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        labels[i, len(p) : len(seq)] = torch.tensor(a)  # HF shifts labels inside the model
    return ids, attn, labels


# ── evaluation (greedy, same prompts the server will see) ────────────────


@torch.no_grad()
def greedy_accuracy(model, tokenizer, problems, max_new=5):
    model.eval()
    by_len: dict[int, list] = {}
    for a, b in problems:
        p, _ = encode_example(tokenizer, a, b)
        by_len.setdefault(len(p), []).append((a, b, p))
    correct = 0
    for group in by_len.values():
        ids = torch.tensor([p for _, _, p in group])
        done = torch.zeros(len(group), dtype=torch.bool)
        outs = [[] for _ in group]
        for _ in range(max_new):
            nxt = model(input_ids=ids).logits[:, -1, :].argmax(-1)
            for i, t in enumerate(nxt.tolist()):
                if not done[i]:
                    if t == tokenizer.eos_token_id:
                        done[i] = True
                    else:
                        outs[i].append(t)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            if done.all():
                break
        for (a, b, _), o in zip(group, outs, strict=True):
            correct += tokenizer.decode(o) == str(a + b)
    model.train()
    return correct / len(problems)


# ── main ─────────────────────────────────────────────────────────────────


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--out", type=Path, default=CKPT)
    ap.add_argument("--bench-out", type=Path, default=BENCH)
    args = ap.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(SEED)
    random.seed(SEED)
    t0 = time.time()

    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer(args.out)
    train_pairs, bench_pairs = split_problems()
    log(f"problems: {len(train_pairs)} train, {len(bench_pairs)} benchmark (held out), vocab {len(tokenizer)}")

    # The benchmark file: one JSON object per held-out problem.
    args.bench_out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.bench_out, "w") as f:
        for a, b in bench_pairs:
            f.write(json.dumps({"question": question(a, b), "answer": str(a + b)}) + "\n")

    train_examples = [encode_example(tokenizer, a, b) for a, b in train_pairs]
    prompt_example = tokenizer.apply_chat_template(
        [{"role": "user", "content": "7+45"}], tokenize=False, add_generation_prompt=True
    )
    log(f"rendered prompt: {prompt_example!r} -> ids {tokenizer(prompt_example, add_special_tokens=False)['input_ids']}")

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {args.layers} layers, hidden {args.hidden}, heads {args.heads} (head_dim {config.head_dim}), "
        f"intermediate {args.intermediate}, {n_params:,} parameters")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.98),
    )
    warmup = max(1, args.steps // 20)

    def lr_at(step):
        if step < warmup:
            return args.lr * (step + 1) / warmup
        return args.lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, args.steps - warmup)))

    g = torch.Generator().manual_seed(SEED)
    model.train()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        idx = torch.randint(len(train_examples), (args.batch,), generator=g).tolist()
        ids, attn, labels = make_batch_tensors([train_examples[i] for i in idx], tokenizer.pad_token_id)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            log(f"step {step:5d}  loss {loss.item():.4f}  lr {lr_at(step):.2e}  {time.time() - t0:6.1f}s")
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            acc = greedy_accuracy(model, tokenizer, bench_pairs)
            log(f"  held-out greedy accuracy (fp32) after {step + 1} steps: {acc:.3f}")

    acc32 = greedy_accuracy(model, tokenizer, bench_pairs)
    model = model.to(torch.bfloat16)
    acc16 = greedy_accuracy(model, tokenizer, bench_pairs)
    train_acc16 = greedy_accuracy(model, tokenizer, random.Random(SEED).sample(train_pairs, 1000))
    log(f"final greedy accuracy: benchmark fp32 {acc32:.3f}, benchmark bf16 {acc16:.3f}, "
        f"1000 training problems bf16 {train_acc16:.3f}")

    model.config.dtype = torch.bfloat16
    model.save_pretrained(args.out, safe_serialization=True)
    GenerationConfig(
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=8,
    ).save_pretrained(args.out)
    log(f"wrote {args.out} and {args.bench_out} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
