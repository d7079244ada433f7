"""Fine-tune a classifier with the Hugging Face Trainer, the way its quick tour writes it."""

from datasets import load_dataset
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
)

checkpoint = "distilbert-base-uncased"
tokenizer = AutoTokenizer.from_pretrained(checkpoint)
raw = load_dataset("imdb")
tokenized = raw.map(lambda ex: tokenizer(ex["text"], truncation=True), batched=True)
model = AutoModelForSequenceClassification.from_pretrained(checkpoint, num_labels=2)

args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=16,
    gradient_accumulation_steps=2,
    num_train_epochs=3,
    eval_strategy="epoch",
    dataloader_num_workers=0,
)
trainer = Trainer(
    model=model,
    args=args,
    train_dataset=tokenized["train"],
    eval_dataset=tokenized["test"],
    data_collator=DataCollatorWithPadding(tokenizer),
)
trainer.train()
