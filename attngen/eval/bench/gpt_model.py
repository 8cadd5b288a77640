"""The small GPT that `attngen bench --gpt-step` trains (and docs/backward-h200/train_compare.py): pre-norm
decoder blocks whose causal self-attention is attngen.attention or torch's SDPA (its own choice of backend),
nothing else different. Imports torch: loaded only where a step runs."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import attngen


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, use_attngen: bool):
        super().__init__()
        self.heads, self.use_attngen = heads, use_attngen
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)   # (B, S, H, Dh)
        if self.use_attngen:
            a = attngen.attention(q, k, v, causal=True, layout="bshd")
        else:
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True).transpose(1, 2)
        x = x + self.proj(a.reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, seqlen: int, use_attngen: bool):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(seqlen, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, use_attngen) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def training_step(model, optimizer, dtype, vocab: int):
    """step(x): forward under autocast in `dtype` on x's first S tokens, cross-entropy against the next
    ones, zero_grad, backward, the optimizer's step; returns the loss (not read back)."""
    def step(x):
        with torch.autocast("cuda", dtype=dtype):
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, vocab), x[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss
    return step


__all__ = ["GPT", "Block", "training_step"]
