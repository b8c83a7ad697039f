"""Tiny random Hugging Face checkpoints and a tiny task, for fast offline tests.

``make_tiny_bert(tmp_path / "bert")`` writes, in well under a second, a directory that loads
like any hub checkpoint: ``config.json``, random weights in ``model.safetensors`` and a working
fast tokenizer over a small word list. kdplug's own tests, the engine's and third-party plugin
authors use them wherever a real teacher would be too slow or need the network.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

from kdplug.types import Example

#: Words of the tiny vocabularies: enough for sentiment-like and pair examples.
TINY_WORDS: tuple[str, ...] = (
    "the",
    "a",
    "an",
    "this",
    "that",
    "it",
    "is",
    "was",
    "were",
    "not",
    "very",
    "really",
    "quite",
    "and",
    "but",
    "movie",
    "film",
    "book",
    "story",
    "plot",
    "acting",
    "music",
    "ending",
    "food",
    "service",
    "good",
    "great",
    "fine",
    "nice",
    "fun",
    "bad",
    "awful",
    "boring",
    "dull",
    "poor",
    "i",
    "we",
    "you",
    "liked",
    "loved",
    "hated",
    "enjoyed",
    "saw",
    "read",
    "same",
    "different",
    "cat",
    "dog",
    "sat",
    "ran",
    ".",
    ",",
    "!",
    "?",
    "##s",
    "##ed",
    "##ing",
    "##ly",
)

#: Sentences the tiny RoBERTa tokenizer's byte-level BPE is trained on.
TINY_SENTENCES: tuple[str, ...] = (
    "the movie was very good .",
    "the film was really bad !",
    "i loved this book , it is great .",
    "we hated the plot and the acting .",
    "the music was fine but the ending was dull .",
    "you enjoyed the food ? the service was poor .",
    "the cat sat and the dog ran .",
    "this story is not boring , it is fun .",
    "a nice film , the same story , a different ending .",
)


def _tiny_config_args(num_layers: int, hidden: int, heads: int, max_positions: int, vocab_size: int) -> dict:
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_positions,
        type_vocab_size=2,
    )


def _save_random_model(model_class, config, path: str, seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    model_class(config).save_pretrained(path)  # safetensors


def wordpiece_tokenizer(vocab_words: Sequence[str] = TINY_WORDS, max_length: int = 64):
    """A BERT-style fast tokenizer (lower-casing WordPiece, [CLS] ... [SEP]) over ``vocab_words``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {token: index for index, token in enumerate(specials + [w for w in vocab_words if w not in specials])}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    backend.decoder = decoders.WordPiece()
    return BertTokenizerFast(tokenizer_object=backend, do_lower_case=True, model_max_length=max_length)


def make_tiny_bert(
    path: str | os.PathLike,
    num_layers: int = 4,
    hidden: int = 32,
    heads: int = 2,
    vocab_words: Sequence[str] = TINY_WORDS,
    max_positions: int = 64,
    seed: int = 0,
) -> str:
    """A random BERT (``BertModel``, no task head) with a WordPiece tokenizer over ``vocab_words``."""
    from transformers import BertConfig, BertModel

    path = os.fspath(path)
    tokenizer = wordpiece_tokenizer(vocab_words, max_positions)
    tokenizer.save_pretrained(path)
    vocab = tokenizer.get_vocab()

    config = BertConfig(
        **_tiny_config_args(num_layers, hidden, heads, max_positions, len(vocab)), pad_token_id=vocab["[PAD]"]
    )
    _save_random_model(BertModel, config, path, seed)
    return path


def make_tiny_roberta(
    path: str | os.PathLike,
    num_layers: int = 4,
    hidden: int = 32,
    heads: int = 2,
    sentences: Sequence[str] = TINY_SENTENCES,
    max_positions: int = 64,
    seed: int = 0,
) -> str:
    """A random RoBERTa (``RobertaModel``) with a byte-level BPE trained on ``sentences``."""
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    path = os.fspath(path)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        list(sentences), vocab_size=400, min_frequency=1, special_tokens=specials, show_progress=False
    )
    bpe.post_processor = processors.RobertaProcessing(
        ("</s>", bpe.token_to_id("</s>")), ("<s>", bpe.token_to_id("<s>"))
    )
    tokenizer = RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, model_max_length=max_positions - 2)
    tokenizer.save_pretrained(path)

    # RoBERTa numbers positions from pad_token_id + 1, hence the two extra position slots.
    config = RobertaConfig(
        **_tiny_config_args(num_layers, hidden, heads, max_positions, bpe.get_vocab_size()),
        pad_token_id=bpe.token_to_id("<pad>"),
        bos_token_id=bpe.token_to_id("<s>"),
        eos_token_id=bpe.token_to_id("</s>"),
    )
    config.type_vocab_size = 1
    _save_random_model(RobertaModel, config, path, seed)
    return path


@dataclass
class TinyTask:
    """A minimal :class:`kdplug.types.Task` over a handful of in-memory examples.

    ``labels=()`` makes it a regression task (metric ``neg_mse``, higher is better). Splits are
    ``"train"`` and ``"dev"``.
    """

    name: str = "tiny"
    labels: tuple[str, ...] = ("negative", "positive")
    is_pair: bool = False
    main_metric: str = "accuracy"
    dev_splits: tuple[str, ...] = ("dev",)
    examples: dict[str, list[Example]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.is_regression and self.main_metric == "accuracy":
            self.main_metric = "neg_mse"

    @property
    def is_regression(self) -> bool:
        return not self.labels

    def load_split(self, split: str) -> list[Example]:
        if split not in self.examples:
            sentences = TINY_SENTENCES[: 6 if split == "train" else 3]
            self.examples[split] = [
                Example(
                    text_a=text,
                    label=float(i % 5) if self.is_regression else i % len(self.labels),
                    text_b=TINY_SENTENCES[-1 - i] if self.is_pair else None,
                )
                for i, text in enumerate(sentences)
            ]
        return self.examples[split]

    def compute_metrics(self, predictions: Sequence[float], references: Sequence[float]) -> dict[str, float]:
        if self.is_regression:
            error = sum((p - r) ** 2 for p, r in zip(predictions, references)) / max(len(references), 1)
            return {"neg_mse": -error}
        correct = sum(int(p) == int(r) for p, r in zip(predictions, references))
        return {"accuracy": correct / max(len(references), 1)}


def cache_as_hub_model(checkpoint: str | os.PathLike, repo_id: str, cache_dir: str | os.PathLike) -> str:
    """Put the files of ``checkpoint`` into the Hugging Face hub cache ``cache_dir`` as if they had
    been downloaded from the hub model ``repo_id``, and return the snapshot directory.

    With ``HF_HUB_CACHE=cache_dir`` (and ``HF_HUB_OFFLINE=1``), anything that loads ``repo_id``
    (``--teacher repo_id``, ``from_pretrained("repo_id")``) then finds a tiny stand-in offline.
    """
    import hashlib
    import shutil

    revision = hashlib.sha1(repo_id.encode()).hexdigest()  # a commit hash is 40 hex digits
    repo = os.path.join(os.fspath(cache_dir), "models--" + repo_id.replace("/", "--"))
    snapshot = os.path.join(repo, "snapshots", revision)
    shutil.copytree(os.fspath(checkpoint), snapshot, dirs_exist_ok=True)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as handle:
        handle.write(revision)
    return snapshot


def make_tiny_classifier(
    path: str | os.PathLike,
    labels: Sequence[str] = ("negative", "positive"),
    *,
    order: Optional[Sequence[int]] = None,
    label_names: Optional[Sequence[str]] = None,
    class_bias: Optional[Sequence[float]] = None,
    num_layers: int = 2,
    hidden: int = 32,
    seed: int = 0,
) -> str:
    """A tiny BERT sequence classifier saved by plain ``transformers`` (no kdplug marker): what a
    checkpoint fine-tuned elsewhere looks like.

    With ``order``, output ``i`` of the saved model is output ``order[i]`` of the same seed's model
    and is named ``labels[order[i]]``: the same classifier, its labels in another order.
    ``label_names`` overrides the saved names; ``class_bias`` adds to the head's bias (a large
    value for one class makes a model that predicts that class for everything).
    """
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    path = os.fspath(path)
    tokenizer = wordpiece_tokenizer(TINY_WORDS, 64)
    tokenizer.save_pretrained(path)
    vocab = tokenizer.get_vocab()
    config = BertConfig(
        **_tiny_config_args(num_layers, hidden, 2, 64, len(vocab)), pad_token_id=vocab["[PAD]"], num_labels=len(labels)
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config)
    order = list(order) if order is not None else list(range(len(labels)))
    with torch.no_grad():
        index = torch.tensor(order)
        model.classifier.weight.copy_(model.classifier.weight[index])  # (C, hidden): row i <- row order[i]
        model.classifier.bias.copy_(model.classifier.bias[index])
        if class_bias is not None:
            model.classifier.bias.add_(torch.tensor(list(class_bias), dtype=model.classifier.bias.dtype))
    names = list(label_names) if label_names is not None else [labels[i] for i in order]
    model.config.id2label = dict(enumerate(names))
    model.config.label2id = {name: i for i, name in enumerate(names)}
    model.save_pretrained(path)
    return path
