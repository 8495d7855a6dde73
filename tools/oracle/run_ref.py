"""Reference counterpart of `ling logits`: runs ling_ref on any checkpoint (Ling or Kimi-Linear, any storage format).

    python tools/oracle/run_ref.py --model DIR --tokens 5,17,42 --out L.npy [--decode N] [--mtp-out M.npy]
                                   [--dtype float32|float64] [--compare L_cpp.npy] [--compare-mtp M_cpp.npy]
                                   [--dump DIR]   (per-layer prefill intermediates: layer{i}.{mixer_out,ffn_out,hidden_out}.npy)

L.npy float32 [T+N, vocab]: rows 0..T-1 prefill logits, then N greedy steps through the cached single-token
path (g0 = argmax(row T-1); feeding g_i yields row T+i). Prints `greedy: g0 ... g(N-1)`.
M.npy float32 [T-1, vocab]: row j = MTP logits from h_j (after model.norm) and token t_{j+1}, RoPE position j.
--compare/--compare-mtp print the relative L2 error of another program's output (e.g. the C++ engine's).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ling_ref as R  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--out", required=True)
    ap.add_argument("--decode", type=int, default=0)
    ap.add_argument("--mtp-out", default="")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--compare", default="")
    ap.add_argument("--compare-mtp", default="")
    ap.add_argument("--dump", default="", help="folder: per-layer prefill intermediates as .npy (for debugging)")
    a = ap.parse_args()
    try:
        tokens = [int(t) for t in a.tokens.split(",")]
    except ValueError:
        sys.exit(f"error: --tokens: '{a.tokens}' is not a list of token ids")
    model = R.load_model(a.model, dtype=getattr(torch, a.dtype))
    V = model.cfg.vocab_size
    if any(t < 0 or t >= V for t in tokens):
        sys.exit(f"error: --tokens: id out of range [0, {V})")
    if a.mtp_out and model.cfg.num_nextn_predict_layers == 0:
        sys.exit(f"error: {a.model}: --mtp-out given but the model has no MTP layer")
    with torch.no_grad():
        if a.dump:
            os.makedirs(a.dump, exist_ok=True)
            model.trace = {}
            _, hn = model.forward(tokens)
            model.trace["final_hidden_norm"] = hn
            for k, v in model.trace.items():
                np.save(os.path.join(a.dump, k + ".npy"), v.float().numpy())
            model.trace = None
            print(f"dumped {len(os.listdir(a.dump))} arrays [T, hidden] to {a.dump}")
        out, _ = R.reference_outputs(model, tokens, a.decode, bool(a.mtp_out), check=False)
    L = torch.cat([out["prefill_logits"], out["decode_logits"]]).float().numpy()
    np.save(a.out, L)
    print("greedy:", " ".join(str(t) for t in out["decode_tokens"]))
    if a.mtp_out:
        M = out["mtp_logits"].float().numpy() if len(tokens) > 1 else np.zeros((0, V), np.float32)
        np.save(a.mtp_out, M)
    if a.compare:
        other = np.load(a.compare)
        print(f"rel L2 vs {a.compare}: {R.rel_l2(torch.from_numpy(other), torch.from_numpy(L)):.3e}")
    if a.compare_mtp and a.mtp_out:
        other = np.load(a.compare_mtp)
        print(f"rel L2 (MTP) vs {a.compare_mtp}: {R.rel_l2(torch.from_numpy(other), torch.from_numpy(M)):.3e}")


if __name__ == "__main__":
    main()
