"""A chat model made from nothing in seconds, so the smoke harness can be proven on a real server.

The model only has to answer a handful of known questions greedily through the server's chat
template; that is enough to tell a working serving path (right answer, clean text) from the
seeds' failure (the same model with broken weights: byte garbage). It is written with the
transformers major the ci-mini image serves, so the server loads it as a real checkpoint.

torch, transformers and tokenizers are imported lazily: collecting the test suite must not
need them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Special tokens; role markers are whole tokens so the template never splits them.
BOS, END, PAD = "<|bos|>", "<|end|>", "<|pad|>"
ROLES = ("system", "user", "assistant")
SPECIALS = [BOS, END, PAD, *(f"<|{role}|>" for role in ROLES)]
#: What the server applies; `<|end|>` after the answer is the eos that stops generation.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>"
    "{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SEED = 1234
#: What the vLLM proof stack (stacks/vllm-0.22-sm90.yaml) asks: its smoke prompts, answered.
VLLM_QA = (
    ("What is the capital of France? Answer with one word.", "Paris."),
    ("What is 17 + 25? Reply with only the number.", "42"),
    ("What is the capital of Kentucky?", "The capital of Kentucky is Frankfort."),
)
#: vLLM's attention kernels want a real head dim: 4 heads of 64 (FlashInfer/FA3 have no 16).
VLLM_SHAPE = {"hidden_size": 256, "intermediate_size": 512, "heads": 4}


def make_tiny_model(
    dest: Path,
    qa: Sequence[tuple[str, str]],
    train_steps: int = 300,
    trained: bool = True,
    *,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    heads: int = 4,
    layers: int = 2,
    dtype: str | None = None,
) -> Path:
    """Write a servable model directory to dest that answers each question of qa greedily.

    trained=False keeps the random initial weights (same tokenizer and architecture): the
    broken-weights case the garbage detector must catch. dtype ("bfloat16") is what the weights
    are saved in, after training in float32. layers: decoder layers (4 for a model that
    pipeline parallel 2 splits into stages of 2).
    """
    import torch

    torch.manual_seed(SEED)
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer([text for pair in qa for text in pair])
    model = _model(tokenizer, hidden_size, intermediate_size, heads, layers)
    if trained:
        _train(model, tokenizer, qa, train_steps)
        _verify(model, tokenizer, qa)
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
        model.config.torch_dtype = dtype
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    _world_readable(dest)
    return dest


def greedy_answer(model: Any, tokenizer: Any, question: str, max_new_tokens: int = 40) -> str:
    """What the server will answer at temperature 0, computed in-process."""
    import torch

    ids = _chat_ids(tokenizer, question)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return str(tokenizer.decode(out[0][len(ids) :], skip_special_tokens=True))


def _tokenizer(texts: list[str]) -> Any:
    """Byte-level BPE on the texts: any string encodes, and random weights decode to bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=END,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=256,
    )


def _model(
    tokenizer: Any, hidden_size: int, intermediate_size: int, heads: int, layers: int = 2
) -> Any:
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in _special_names().items()}
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=256,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        do_sample=False,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
    )
    return model


def _special_names() -> dict[str, str]:
    return {"bos": BOS, "eos": END, "pad": PAD}


def _chat_ids(tokenizer: Any, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _batch(tokenizer: Any, qa: Sequence[tuple[str, str]]) -> tuple[Any, Any, Any]:
    """Padded inputs with the loss on the answer and its end token only (not the question)."""
    import torch

    rows: list[tuple[list[int], list[int]]] = []
    for question, answer in qa:
        prompt = _chat_ids(tokenizer, question)
        target = list(tokenizer(answer + END, add_special_tokens=False)["input_ids"])
        rows.append((prompt + target, [-100] * len(prompt) + target))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    return input_ids, labels, mask


def _train(model: Any, tokenizer: Any, qa: Sequence[tuple[str, str]], steps: int) -> None:
    import torch

    # One thread: on a busy 2-core host, two threads made each step ten times slower.
    torch.set_num_threads(1)
    input_ids, labels, mask = _batch(tokenizer, qa)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def _verify(model: Any, tokenizer: Any, qa: Sequence[tuple[str, str]]) -> None:
    """Fail here, not in a server log, when training was too short to learn the answers."""
    for question, answer in qa:
        got = greedy_answer(model, tokenizer, question)
        if got.strip() != answer.strip():
            raise AssertionError(f"tiny model answers {got!r} to {question!r}, not {answer!r}")


def _world_readable(dest: Path) -> None:
    """The container may run as another user; pytest's tmp folders are private (0700)."""
    dest.chmod(0o755)
    for path in dest.iterdir():
        path.chmod(0o644)


if __name__ == "__main__":  # a quick manual check: time one build
    import sys

    start = time.monotonic()
    if sys.argv[1] == "--vllm":  # the sm90 proof stack's model: head dim 64, bf16
        out = make_tiny_model(Path(sys.argv[2]), VLLM_QA, 400, dtype="bfloat16", **VLLM_SHAPE)
    else:
        out = make_tiny_model(
            Path(sys.argv[1]),
            [("What is the capital of Kentucky?", "The capital of Kentucky is Frankfort.")],
        )
    print(out, f"{time.monotonic() - start:.1f}s")
