"""Token classification (NER): `family` (the registered `token_classification` family), `conll` (CoNLL reader,
sub-token alignment, word tags back), `seqeval` (conlleval / seqeval entity scores)."""

from ampft.tasks.token_classification.family import TOKEN_CLASSIFICATION, TokenClassification

__all__ = ["TOKEN_CLASSIFICATION", "TokenClassification"]
