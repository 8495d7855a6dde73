"""Compare this trainer's model (loaded from the exported checkpoint) with tools/oracle/run_ref.py on one prompt.

    python3 tools/train/compare_oracle.py --model models/ling-gsm8k [--question "..."]
Prints the relative L2 error of the prefill logits and of the MTP logits (fp32, CPU).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat  # noqa: E402
import export  # noqa: E402
from model import Cfg, LingModel  # noqa: E402


def cfg_from_json(path):
    import json
    j = json.load(open(path))
    c = Cfg()
    for k in list(vars(c)):
        if k in j:
            setattr(c, k, j[k])
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/ling-gsm8k")
    ap.add_argument("--question", default="Natalia sold clips to 48 of her friends in April, and then she sold half as "
                                          "many clips in May. How many clips did Natalia sell altogether?")
    a = ap.parse_args()
    torch.set_flush_denormal(True)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    ids = tok.encode(chat.prompt(a.question, True)).ids
    c = cfg_from_json(os.path.join(a.model, "config.json"))
    m = LingModel(c)
    export.load_into(m, a.model)
    m.eval()
    with torch.no_grad():
        logits, mtp = m(torch.tensor([ids]))
    logits, mtp = logits[0].numpy(), mtp[0].numpy()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory() as d:
        lp, mp = os.path.join(d, "L.npy"), os.path.join(d, "M.npy")
        subprocess.run([sys.executable, os.path.join(root, "tools/oracle/run_ref.py"), "--model", a.model, "--tokens",
                        ",".join(map(str, ids)), "--out", lp, "--mtp-out", mp], check=True)
        L, M = np.load(lp), np.load(mp)
    rel = np.linalg.norm(L[:len(ids)] - logits) / np.linalg.norm(L[:len(ids)])
    relm = np.linalg.norm(M - mtp) / np.linalg.norm(M)
    same = (L[:len(ids)].argmax(-1) == logits.argmax(-1)).mean()
    print(f"tokens {len(ids)}: prefill logits rel L2 {rel:.3e} (argmax agreement {same:.3f}); MTP logits rel L2 {relm:.3e}")


if __name__ == "__main__":
    main()
