"""Bytes a bfloat16 token embedding saves under bf16 autocast (nanochat's setting on CUDA; `--embedding_dtype`).

    python benchmarks/embedding_memory.py                      # d20 width and vocab, 1, 2 and 4 layers, on CPU
    python benchmarks/embedding_memory.py --device cuda --layers 20 --tokens 65536

For a float32 and a bfloat16 embedding: the embedding's weight + gradient bytes, and the bytes of the activations
saved for backward during one forward (counted once per storage with `torch.autograd.graph.saved_tensors_hooks`;
the bf16 copies autocast makes of every weight are included, alike in both). The difference per token per layer
comes from the residual stream, which is bf16 when the embedding is. The last line extrapolates it to d20 with
nanochat's 32 x 2048 tokens per device.
"""

from __future__ import annotations

import argparse

import torch

from nanochat_hf import NanoChatGPTConfig, NanoChatGPTForCausalLM

MIB = 2**20


def measure(layers: int, tokens: int, depth: int, vocab: int, device: str, embedding: torch.dtype) -> tuple[int, int]:
    """(embedding weight + gradient bytes, saved activation bytes) of one forward/backward of `tokens` tokens."""
    config = NanoChatGPTConfig.from_depth(depth, vocab_size=vocab, sequence_len=max(tokens, 2048))
    config.n_layer = layers
    torch.manual_seed(0)
    model = NanoChatGPTForCausalLM(config).to(device)
    model.get_input_embeddings().to(embedding)
    ids = torch.randint(0, vocab, (1, tokens + 1), device=device)
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast(device, dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    w = model.get_input_embeddings().weight
    return w.nbytes + w.grad.nbytes, sum(storages.values())


def main(argv: list[str] | None = None) -> list[float]:
    """Prints the table; returns the saved-activation bytes per token per layer that the bf16 embedding saves."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=20, help="model width and heads of this depth (d20: 1280)")
    parser.add_argument("--vocab", type=int, default=65536)
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4], help="layers actually built")
    parser.add_argument("--tokens", type=int, default=256, help="tokens in the forward")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    a = parser.parse_args(argv)
    torch.set_num_threads(a.threads)
    per_layer_token = []
    print("| layers | tokens | embedding | wte weight + grad (MiB) | saved activations (MiB) |")
    print("|---|---|---|---|---|")
    for layers in a.layers:
        saved = {}
        for dtype in (torch.float32, torch.bfloat16):
            weights, saved[dtype] = measure(layers, a.tokens, a.depth, a.vocab, a.device, dtype)
            print(f"| {layers} | {a.tokens} | {str(dtype)[6:]} | {weights / MIB:.1f} | {saved[dtype] / MIB:.1f} |")
        per_layer_token.append((saved[torch.float32] - saved[torch.bfloat16]) / (layers * a.tokens))
    print(
        f"saved activations, float32 - bfloat16 embedding: {', '.join(f'{b:.0f}' for b in per_layer_token)} "
        "bytes per token per layer"
    )
    d20 = per_layer_token[-1] * 20 * 32 * 2048
    print(f"d20, 32 x 2048 tokens per device: {d20 / 2**30:.2f} GiB less saved for backward")
    return per_layer_token


if __name__ == "__main__":
    main()
