"""The text-classifier family: a transformers sequence classifier (``text_classifier``) and the tiny
BERT built from random weights for the default job (``tiny_bert``)."""
