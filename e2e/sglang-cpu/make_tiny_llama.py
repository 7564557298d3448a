"""Write a tiny Llama (random weights, fixed seed) and its tokenizer into a directory, for the real
SGLang of the e2e world (no model hub here). Run with the real-engine environment's packages::

    PYTHONPATH=~/.cache/kvgate/sglang-cpu/0.5.23/site .venv/bin/python \
        e2e/sglang-cpu/make_tiny_llama.py OUT_DIR [--seed 0]

Greedy decoding of random weights is deterministic, so a known answer recorded from one server
tells whether another (a prefill->decode pair) computed the same tokens from the same KV pages.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A context window is a claim; a KV pool that holds it is a capability.",
    "kvgate verifies every prefill and decode engine before it takes traffic.",
    "Pack my box with five dozen liquor jugs, then count the pages of the pool.",
    "Sphinx of black quartz, judge my vow: 0 1 2 3 4 5 6 7 8 9.",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(out)

    torch.manual_seed(args.seed)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(fast),
        max_position_embeddings=131072,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    (out / "kvgate-tiny-llama.json").write_text(
        json.dumps({"seed": args.seed, "vocab_size": len(fast)}) + "\n"
    )
    print(f"tiny llama (seed {args.seed}, vocab {len(fast)}) written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
