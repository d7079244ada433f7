"""Fine-tune a sequence classifier, Hugging Face style (dict batches, tqdm, AdamW)."""

import argparse
import logging

import torch
from datasets import load_dataset
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoModelForSequenceClassification, get_linear_schedule_with_warmup

logger = logging.getLogger(__name__)


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="bert-base-uncased")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-workers", type=int, default=4)
    p.add_argument("--log-every", type=int, default=100)
    return p.parse_args()


def main():
    args = get_args()
    device = "cuda"
    train_ds = load_dataset("glue", "sst2", split="train").with_format("torch")
    train_dl = DataLoader(
        train_ds,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        pin_memory=True,
    )
    model = AutoModelForSequenceClassification.from_pretrained(args.model).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, 100, args.epochs * len(train_dl))
    for epoch in range(args.epochs):
        model.train()
        progress = tqdm(train_dl, desc=f"epoch {epoch}")
        for step, batch in enumerate(progress):
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast("cuda", dtype=torch.bfloat16):
                outputs = model(**batch)
            loss = outputs.loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            progress.set_postfix(loss=loss.item())
            if step % args.log_every == 0:
                logger.info("epoch %d step %d loss %.4f", epoch, step, loss.item())
    model.save_pretrained("out")


if __name__ == "__main__":
    main()
