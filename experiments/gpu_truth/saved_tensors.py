"""What autograd saves for the backward, by dtype and shape (issue 21: where a memory model's
activation count goes wrong).

For each configuration it runs one forward under `torch.autograd.graph.saved_tensors_hooks`
and records every tensor autograd packs: its storage (so a tensor saved by several ops, or a
view of another, counts once), dtype, shape and the autograd node that saved it. It writes the
unique storages' bytes grouped by (dtype, shape, node), with the allocated bytes after the
forward minus before (what the forward left alive, saved or not).

    python3 experiments/gpu_truth/saved_tensors.py --out saved.json [--only NAME,...] [--device cpu]

`--device cpu --tiny` checks the script itself on a small model without a GPU.
"""

import argparse
import collections
import json
import sys

# name -> (model class, size, seq, batch, autocast dtype or None, attention)
CONFIGS = {
    "bert-large-squad-fp16-eager-b16": ("squad", "large", 384, 16, "fp16", "eager"),
    "bert-large-squad-fp16-sdpa-b16": ("squad", "large", 384, 16, "fp16", "sdpa"),
    "bert-large-squad-fp32-eager-b10": ("squad", "large", 384, 10, None, "eager"),
    "gpt2-medium-bf16-sdpa-b8": ("gpt2", "medium", 1024, 8, "bf16", "sdpa"),
    "gpt2-medium-fp32-sdpa-b8": ("gpt2", "medium", 1024, 8, None, "sdpa"),
}


def build(kind, size, seq, attn, tiny):
    from transformers import BertConfig, BertForQuestionAnswering, GPT2Config, GPT2LMHeadModel

    if kind == "gpt2":
        kw = dict(n_embd=1024, n_layer=24, n_head=16) if not tiny else dict(n_embd=64, n_layer=2, n_head=4)
        cfg = GPT2Config(n_positions=seq, attn_implementation=attn, **kw)
        return GPT2LMHeadModel(cfg), cfg
    kw = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
    if tiny:
        kw = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)
    cfg = BertConfig(attn_implementation=attn, vocab_size=30528, max_position_embeddings=max(512, seq), **kw)
    return BertForQuestionAnswering(cfg), cfg


def measure(name, dev, tiny):
    import torch

    kind, size, seq, batch, amp, attn = CONFIGS[name]
    if tiny:
        seq, batch = 32, 2
    torch.manual_seed(0)
    model, cfg = build(kind, size, seq, attn, tiny)
    model = model.to(dev).train()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(amp)
    cuda = dev.type == "cuda"
    saved = {}  # storage key -> (bytes, dtype, shape, node)
    node_of = {"name": "?"}

    def pack(t):
        try:
            st = t.untyped_storage()
            key = (st.data_ptr(), st.nbytes(), str(t.device))
            nbytes = st.nbytes()
        except Exception:  # a tensor without a storage (wrapper subclasses)
            key, nbytes = (id(t), 0, "?"), 0
        if key not in saved:
            g = t.grad_fn
            saved[key] = (nbytes, str(t.dtype).replace("torch.", ""), tuple(t.shape),
                          type(g).__name__ if g is not None else "leaf/output")
        return t

    def unpack(t):
        return t

    if cuda:
        torch.cuda.synchronize()
    before = torch.cuda.memory_allocated() if cuda else 0
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            if kind == "gpt2":
                out = model(input_ids=ids)
                logits = out.logits[:, :-1].reshape(-1, out.logits.shape[-1])
                loss = torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:].reshape(-1))
            else:
                out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
                start = torch.randint(0, seq, (batch,), device=dev)
                loss = (torch.nn.functional.cross_entropy(out.start_logits.float(), start)
                        + torch.nn.functional.cross_entropy(out.end_logits.float(), start)) / 2
    if cuda:
        torch.cuda.synchronize()
    after = torch.cuda.memory_allocated() if cuda else 0
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    groups = collections.defaultdict(lambda: [0, 0])
    total = 0
    weights = 0
    for (ptr, _, _), (nbytes, dt, shape, node) in saved.items():
        if ptr in params:
            weights += nbytes
            continue
        g = groups[(dt, str(list(shape)), node)]
        g[0] += 1
        g[1] += nbytes
        total += nbytes
    rows = sorted(({"dtype": k[0], "shape": k[1], "made_by": k[2], "count": v[0], "bytes": v[1]}
                   for k, v in groups.items()), key=lambda r: -r["bytes"])
    del loss, out
    return {"name": name, "seq": seq, "batch": batch, "amp": amp, "attention": attn,
            "saved_unique_bytes": total, "saved_parameters_bytes": weights,
            "forward_allocated_delta_bytes": after - before, "groups": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    import torch

    dev = torch.device(a.device)
    names = a.only.split(",") if a.only else list(CONFIGS)
    res = []
    for n in names:
        if n not in CONFIGS:
            sys.exit(f"unknown configuration {n}; known: {', '.join(CONFIGS)}")
        try:
            r = measure(n, dev, a.tiny)
        except Exception as e:
            r = {"name": n, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        res.append(r)
        if "error" in r:
            print(n, r["error"], flush=True)
        else:
            print(f"{n}: saved {r['saved_unique_bytes'] / 1e9:.3f} GB unique (+ {r['saved_parameters_bytes'] / 1e9:.3f} GB "
                  f"of parameters), forward left {r['forward_allocated_delta_bytes'] / 1e9:.3f} GB", flush=True)
            for g in r["groups"][:14]:
                print(f"   {g['bytes'] / 1e9:8.3f} GB  {g['count']:4d} x {g['dtype']:9} {g['shape']:22} {g['made_by']}")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
