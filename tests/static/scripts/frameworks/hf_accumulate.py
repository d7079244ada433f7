"""Fine-tune a sequence classifier in a custom loop, Hugging Face course style, with gradient accumulation."""

import argparse

import numpy as np
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
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    raw = load_dataset("imdb")
    tokenized = raw.map(lambda ex: tokenizer(ex["text"], truncation=True), batched=True)
    tokenized = tokenized.remove_columns(["text"]).rename_column("label", "labels")
    tokenized.set_format("torch")
    collator = DataCollatorWithPadding(tokenizer)
    train_dataloader = DataLoader(tokenized["train"], shuffle=True, collate_fn=collator,
                                  batch_size=args.per_device_train_batch_size, num_workers=4)
    eval_dataloader = DataLoader(tokenized["test"], batch_size=64, collate_fn=collator)

    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, num_labels=2)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)
    num_update_steps = args.num_train_epochs * len(train_dataloader) // args.gradient_accumulation_steps
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0,
                                 num_training_steps=num_update_steps)

    for epoch in range(args.num_train_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            loss = outputs.loss / args.gradient_accumulation_steps
            loss.backward()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

        model.eval()
        predictions, references = [], []
        for batch in eval_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            preds = outputs.logits.argmax(dim=-1)
            predictions += preds.cpu().numpy().tolist()
            references += batch["labels"].cpu().numpy().tolist()
        accuracy = (np.array(predictions) == np.array(references)).mean()
        print(f"epoch {epoch}: accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
