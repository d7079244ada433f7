"""The same custom loop, tuned: workers and pinned batches, bf16 autocast, evaluation under inference_mode
with predictions kept on the GPU until the end of the epoch."""

import argparse
import os

import torch
from datasets import load_dataset
from torch.utils.data import DataLoader
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    get_scheduler,
)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_name_or_path", default="distilbert-base-uncased")
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
    parser.add_argument("--num_workers", type=int, default=os.cpu_count() - 1)
    args = parser.parse_args()

    device = torch.device("cuda")
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    raw = load_dataset("imdb")
    tokenized = raw.map(lambda ex: tokenizer(ex["text"], truncation=True), batched=True)
    tokenized = tokenized.remove_columns(["text"]).rename_column("label", "labels")
    tokenized.set_format("torch")
    collator = DataCollatorWithPadding(tokenizer)
    loader_kwargs = dict(collate_fn=collator, num_workers=args.num_workers, pin_memory=True, persistent_workers=True)
    train_dataloader = DataLoader(tokenized["train"], shuffle=True, batch_size=args.per_device_train_batch_size,
                                  **loader_kwargs)
    eval_dataloader = DataLoader(tokenized["test"], batch_size=64, **loader_kwargs)

    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, num_labels=2)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)
    num_update_steps = args.num_train_epochs * len(train_dataloader) // args.gradient_accumulation_steps
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0,
                                 num_training_steps=num_update_steps)

    for epoch in range(args.num_train_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**batch).loss / args.gradient_accumulation_steps
            loss.backward()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad(set_to_none=True)

        model.eval()
        correct = torch.zeros((), device=device)
        with torch.inference_mode():
            for batch in eval_dataloader:
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(**batch).logits
                correct += (logits.argmax(dim=-1) == batch["labels"]).sum()
        print(f"epoch {epoch}: accuracy {correct.item() / len(eval_dataloader.dataset):.4f}")


if __name__ == "__main__":
    main()
