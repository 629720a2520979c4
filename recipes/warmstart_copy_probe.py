"""How fast a tiny Qwen2 learns the warm start's digit copy: a plain PyTorch loop on the task's own demonstrations.

Diagnosis tool behind docs/warmstart.md "Version 4", not the warm start itself (that is verl's SFT trainer):
AdamW with verl's SFT settings (betas 0.9/0.999, weight decay 0.01, clip 1.0, a linear warm-up then constant, loss
averaged over the loss-masked tokens), batches drawn with replacement. Every ``--every`` steps it prints, on the
held-out demonstrations, the teacher-forced probability of the right digit (the answer the agent must copy from its
tool response) and the share of digits with p > 0.5. ``--restart N`` emulates the warm restart (a fresh optimizer
and warm-up after step N).

    python recipes/warmstart_copy_probe.py --init-range 0.1 --seed 2 --steps 400 --restart 250
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer, Qwen2ForCausalLM

from mgrpo_verl.models.tiny import IM_END, build_tiny_tokenizer, tiny_qwen2_config
from mgrpo_verl.warmstart import demos
from mgrpo_verl.warmstart.dataset import JsonToolsSFTDataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agent", default="main", choices=demos.AGENTS)
    p.add_argument("--init-range", type=float, default=0.02, help="weights' init std (Qwen2's default: 0.02)")
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--restart", type=int, default=0, help="fresh optimizer and warm-up after this step (0: none)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0, help="init and batch seed")
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--warmup-steps", type=int, default=20, help="linear lr warm-up, again after a restart")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    tokenizer_dir = build_tiny_tokenizer()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    data = demos.write_sft_datasets(tempfile.mkdtemp(prefix="copy-probe-"), "relay_tools", 256, 32, 0, 0.3)

    def load(split: str) -> dict[str, torch.Tensor]:
        config = OmegaConf.create({"max_length": 448, "truncation": "error"})
        dataset = JsonToolsSFTDataset(str(data[args.agent][split]), tokenizer, config)
        items = [dataset[i] for i in range(len(dataset))]
        return {k: torch.stack([x[k] for x in items]) for k in ("input_ids", "attention_mask", "loss_mask")}

    train, val = load("train"), load("val")
    digits = torch.tensor([tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)])
    config = tiny_qwen2_config(len(tokenizer), initializer_range=args.init_range, attn_implementation="sdpa",
                               eos_token_id=tokenizer.convert_tokens_to_ids(IM_END), pad_token_id=0)
    model = Qwen2ForCausalLM(config)

    def new_optimizer() -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), weight_decay=0.01)

    def token_log_probs(batch):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        target, mask = batch["input_ids"][:, 1:], batch["loss_mask"][:, 1:].bool()
        return torch.log_softmax(logits.float(), -1).gather(-1, target.unsqueeze(-1)).squeeze(-1), target, mask

    optimizer, generator, start = new_optimizer(), torch.Generator().manual_seed(args.seed), time.monotonic()
    warm = max(1, args.warmup_steps)
    for step in range(1, args.steps + 1):
        if args.restart and step == args.restart + 1:
            optimizer = new_optimizer()
        local = step - args.restart if args.restart and step > args.restart else step
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, local / warm)
        rows = torch.randint(0, len(train["input_ids"]), (args.batch_size,), generator=generator)
        lp, _, mask = token_log_probs({k: v[rows] for k, v in train.items()})
        loss = -(lp * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % args.every == 0 or step == args.steps:
            model.eval()
            with torch.no_grad():
                lp, target, mask = token_log_probs(val)
            model.train()
            p_digit = lp[mask & torch.isin(target, digits)].exp()
            figures = {"step": step, "train_loss": round(loss.item(), 4), "p_digit": round(p_digit.mean().item(), 3),
                       "digits_above_half": round((p_digit > 0.5).float().mean().item(), 3),
                       "seconds": round(time.monotonic() - start, 1)}
            print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
