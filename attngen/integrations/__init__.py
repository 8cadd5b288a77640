"""Where attngen plugs into code that does not call it by name.

- sdpa.py: attngen as torch's flash-attention backend (torch.nn.attention's registry, torch 2.11):
  `attngen.enable()` makes plain F.scaled_dot_product_attention run attngen's forward and backward
  for every input the dispatch table serves, and torch's own flash kernel for the rest.
- hf.py: `attn_implementation="attngen"` for Hugging Face transformers models (AttentionInterface).

Neither imports torch or transformers before a function of it runs (docs/integrations.md).
"""
