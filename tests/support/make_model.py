"""Build a tiny random-weight Llama and a byte-level BPE tokenizer offline, in seconds.

python tests/support/make_model.py DIR [--layers 2] [--hidden 128] [--seed 0]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def build(
    out: Path,
    layers: int = 2,
    hidden: int = 128,
    vocab: int = 1024,
    seed: int = 0,
    max_len: int = 4096,
    heads: int = 4,
) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    # Tokenizer: byte-level BPE trained on generated text; exactly `vocab` entries.
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    words = [f"{a}{b}" for a in "the quick brown fox jumps over lazy dog" for b in "aeiou"]
    corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(64)) for i in range(200)]
    special = ["<s>", "</s>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.model_max_length = max_len
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,  # token ids past the trained BPE merges are valid model inputs
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_len,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-len", type=int, default=4096, help="longest prompt + output, tokens")
    p.add_argument("--heads", type=int, default=4)
    a = p.parse_args()
    t = time.monotonic()
    build(a.out, a.layers, a.hidden, seed=a.seed, max_len=a.max_len, heads=a.heads)
    print(f"model in {a.out} ({time.monotonic() - t:.1f} s)")


if __name__ == "__main__":
    main()
