"""Train, evaluate and export the embedded default model (models/ling-gsm8k, docs/default-model.md).

    python3 tools/train/train.py --data DIR --tokenizer models/ling-gsm8k/tokenizer.json --out OUTDIR \
        --train-seconds 330 [--tiny] [--device cuda]

The script watches the clock: the learning-rate schedule runs on elapsed time, quantization-aware training
(experts fake-quantized to MXFP4, other projections to block FP8) takes the last --qat-frac of it.
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat  # noqa: E402
import export  # noqa: E402
from model import Cfg, LingModel, count_params  # noqa: E402


def encode_rows(tok, rows, thinking_flags, max_len):
    out = []
    for r, th in zip(rows, thinking_flags):
        sol, n = chat.split_answer(r["answer"])
        p = tok.encode(chat.prompt(r["question"], th)).ids
        t = tok.encode(chat.target(sol, n, th)).ids
        if len(p) + len(t) > max_len:
            continue
        out.append((p + t, [0] * len(p) + [1] * len(t)))
    return out


def make_batch(examples, device, mult=16, pad_id=0):
    T = max(len(e[0]) for e in examples)
    T = -(-T // mult) * mult
    ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), T), dtype=torch.float32)
    for i, (x, m) in enumerate(examples):
        ids[i, :len(x)] = torch.tensor(x)
        mask[i, :len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids.to(device), mask.to(device)


def losses(model, ids, mask, mtp=True):
    logits, mlog = model(ids, mtp=mtp)
    V = logits.shape[-1]
    m1 = mask[:, 1:]
    l1 = F.cross_entropy(logits[:, :-1].float().reshape(-1, V), ids[:, 1:].reshape(-1), reduction="none")
    main = (l1 * m1.reshape(-1)).sum() / m1.sum()
    if mlog is None:
        return main, None, None
    m2 = mask[:, 2:]
    l2 = F.cross_entropy(mlog[:, :-1].float().reshape(-1, V), ids[:, 2:].reshape(-1), reduction="none")
    mtp_loss = (l2 * m2.reshape(-1)).sum() / m2.sum()
    acc = ((mlog[:, :-1].argmax(-1) == ids[:, 2:]).float() * m2).sum() / m2.sum()
    return main, mtp_loss, acc


@torch.no_grad()
def evaluate(model, val, device, bs, amp):
    model.eval()
    tot = {"loss": 0.0, "mtp_loss": 0.0, "mtp_acc": 0.0, "n": 0.0, "n2": 0.0}
    for i in range(0, len(val), bs):
        ids, mask = make_batch(val[i:i + bs], device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            a, b, c = losses(model, ids, mask)
        n1, n2 = mask[:, 1:].sum().item(), mask[:, 2:].sum().item()
        tot["loss"] += a.item() * n1
        tot["mtp_loss"] += b.item() * n2
        tot["mtp_acc"] += c.item() * n2
        tot["n"] += n1
        tot["n2"] += n2
    model.train()
    return {"loss": tot["loss"] / tot["n"], "mtp_loss": tot["mtp_loss"] / tot["n2"], "mtp_acc": tot["mtp_acc"] / tot["n2"]}


@torch.no_grad()
def generate(model, tok, question, thinking, device, max_new=300):
    model.eval()
    ids = tok.encode(chat.prompt(question, thinking)).ids
    eos = tok.token_to_id(chat.EOS)
    out = []
    for _ in range(max_new):
        x = torch.tensor([ids + out], device=device)
        logits, _ = model(x, mtp=False)
        nxt = int(logits[0, -1].argmax())
        if nxt == eos:
            break
        out.append(nxt)
    model.train()
    return tok.decode(out, skip_special_tokens=False), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-seconds", type=float, default=330)
    ap.add_argument("--max-steps", type=int, default=10 ** 9)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--qat-frac", type=float, default=0.15)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--max-len", type=int, default=384)
    ap.add_argument("--n-val", type=int, default=300)
    ap.add_argument("--n-samples", type=int, default=3)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--val-every", type=float, default=45.0)
    ap.add_argument("--gen-tokens", type=int, default=320)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t_start = time.time()
    torch.manual_seed(a.seed)
    torch.set_flush_denormal(True)
    random.seed(a.seed)
    device = torch.device(a.device)
    amp = device.type == "cuda"
    if amp:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(a.tokenizer)

    rows = chat.load_jsonl(os.path.join(a.data, "train.jsonl"))
    test_rows = chat.load_jsonl(os.path.join(a.data, "test.jsonl"))
    train_rows, val_rows = rows[:-a.n_val], rows[-a.n_val:]
    if a.tiny:
        train_rows = train_rows[:256]
        val_rows = val_rows[:8]
    train_on = encode_rows(tok, train_rows, [True] * len(train_rows), a.max_len)
    train_off = encode_rows(tok, train_rows, [False] * len(train_rows), a.max_len)
    val = encode_rows(tok, val_rows, [i % 10 < 7 for i in range(len(val_rows))], a.max_len)
    lens = sorted(len(e[0]) for e in train_on)
    print(f"train {len(train_on)} on / {len(train_off)} off, val {len(val)}, len median {lens[len(lens) // 2]} "
          f"max {lens[-1]}", flush=True)

    cfg = Cfg(vocab_size=tok.get_vocab_size(), pad_token_id=tok.token_to_id("<|endoftext|>"),
              eos_token_id=tok.token_to_id(chat.EOS))
    if a.tiny:
        cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size = 128, 2, 128
        cfg.moe_intermediate_size = cfg.moe_shared_expert_intermediate_size = 64
        cfg.kv_lora_rank = 64
    model = LingModel(cfg).to(device)
    model.set_dropout(a.dropout)
    n_params = count_params(model)
    print(f"params {n_params} ({n_params / 1e6:.2f} M)", flush=True)

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 and "conv1d" not in n else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=(device.type == "cuda"))
    warmup = 60
    t0 = time.time()
    step, qat_on, log, val_log, t_val = 0, False, [], [], time.time()
    while True:
        el = time.time() - t0
        frac = el / a.train_seconds
        if frac >= 1.0 or step >= a.max_steps:
            break
        if not qat_on and (frac >= 1.0 - a.qat_frac or (a.max_steps < 10 ** 9 and step >= a.max_steps * (1 - a.qat_frac))):
            model.set_qat(True)
            qat_on = True
            print(f"step {step}: QAT on", flush=True)
        lr = a.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for gpar in opt.param_groups:
            gpar["lr"] = lr
        batch = [random.choice(train_on) if random.random() < 0.7 else random.choice(train_off) for _ in range(a.batch)]
        ids, mask = make_batch(batch, device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
            main_loss, mtp_loss, mtp_acc = losses(model, ids, mask)
            loss = main_loss + a.mtp_weight * mtp_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # aux-loss-free balancing: bias += u * sign(mean_load - load)
            for moe in model.moe_layers():
                ld = moe.last_load
                moe.gate.expert_bias += a.bias_rate * torch.sign(ld.mean() - ld)
        if time.time() - t_val >= a.val_every:
            t_val = time.time()
            v = evaluate(model, val[:96], device, 48, amp)
            vrec = {"step": step, "t": round(time.time() - t0, 1), "val_loss": round(v["loss"], 4),
                    "val_mtp_acc": round(v["mtp_acc"], 4)}
            val_log.append(vrec)
            print(vrec, flush=True)
        if step % 25 == 0:
            rec = {"step": step, "t": round(time.time() - t0, 1), "loss": round(main_loss.item(), 4),
                   "mtp": round(mtp_loss.item(), 4), "acc": round(mtp_acc.item(), 3), "lr": round(lr, 6),
                   "gn": round(gn.item(), 3)}
            log.append(rec)
            print(rec, flush=True)
        step += 1
    train_time = time.time() - t0
    print(f"trained {step} steps in {train_time:.1f} s", flush=True)
    if not qat_on:
        model.set_qat(True)

    # make the high-precision tensors exactly what the export stores (bf16), so export == model
    export.round_to_storage(model)
    res = {"steps": step, "train_seconds": round(train_time, 1), "params": n_params, "batch": a.batch,
           "device": torch.cuda.get_device_name() if amp else "cpu", "log": log,
           "val_log": val_log, "lr": a.lr, "dropout": a.dropout, "qat_frac": a.qat_frac, "mtp_weight": a.mtp_weight}
    os.makedirs(a.out, exist_ok=True)
    files = export.export(model, cfg, a.out)
    print("exported", files, flush=True)
    try:
        post(a, model, cfg, tok, val, test_rows, device, amp, res)
    except Exception:  # keep the exported files and what was measured
        import traceback
        traceback.print_exc()
        res["post_error"] = traceback.format_exc()
    res["total_seconds"] = round(time.time() - t_start, 1)
    with open(os.path.join(a.out, "train_summary.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("summary", {k: v for k, v in res.items() if k not in ("log", "samples", "val_log")}, flush=True)


def post(a, model, cfg, tok, val, test_rows, device, amp, res):
    res["val_qat"] = evaluate(model, val, device, 32, amp)
    print("val (fake-quantized, bf16 autocast)", res["val_qat"], flush=True)

    # reload the export, dequantize, compare logits in fp32 against the fake-quantized model
    m2 = LingModel(cfg).to(device)
    export.load_into(m2, a.out)
    m2.set_qat(False)
    model.eval(), m2.eval()
    ids, mask = make_batch(val[:4], device)
    with torch.no_grad():
        l1, t1 = model(ids)
        l2, t2 = m2(ids)
    rel = ((l1 - l2).norm() / l1.norm()).item()
    relm = ((t1 - t2).norm() / t1.norm()).item()
    res["export_logit_rel_err"] = rel
    res["export_mtp_logit_rel_err"] = relm
    print(f"export reload: logits rel err {rel:.3e}, mtp {relm:.3e}", flush=True)
    res["val_export_fp32"] = evaluate(m2, val, device, 32, False)
    print("val (exported weights, fp32)", res["val_export_fp32"], flush=True)
    samples = []
    for r in test_rows[:a.n_samples]:
        for th in ([True, False] if len(samples) == 0 else [True]):
            text, out = generate(m2, tok, r["question"], th, device, a.gen_tokens)
            samples.append({"question": r["question"], "thinking": th, "reference": chat.split_answer(r["answer"])[1],
                            "output": text, "n_tokens": len(out)})
            print("=" * 60, "\nQ:", r["question"], "\nthinking:", th, "\nA:", text, flush=True)
    res["samples"] = samples
    if amp:
        res["max_gpu_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)


if __name__ == "__main__":
    main()
