"""Task families beyond sequence classification: one module each, plain functions over `datasets.Dataset`.

Each module reads its data format, turns examples into model features (and back), and scores predictions
with an offline `evaluate.Metric`, without depending on the training loop, so it can be tested on its own
and wired into any loop: `ner` (token classification, CoNLL files), `qa` (extractive QA, SQuAD JSON).
"""
