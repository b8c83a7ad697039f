"""The augmenters' operations against the papers' definitions, with fixed seeds and over many draws."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
import torch

import kdplug
from kdplug.errors import ConfigError
from kdplug.testing.tiny import TinyTask
from kdplug_augment.tang import TangAugmenter, mask_or_replace, sample_ngram

SENTENCE = "the movie was very good but the ending was really dull and the acting was bad ."
WORDS = SENTENCE.split()


def within(observed: int, trials: int, p: float, sigmas: float = 4.0) -> bool:
    """``observed`` successes in ``trials`` are within ``sigmas`` binomial standard deviations of ``p``."""
    return abs(observed - trials * p) <= sigmas * math.sqrt(trials * p * (1 - p))


@pytest.fixture(scope="module")
def registry():
    return kdplug.get_plugin_manager().registry


@pytest.fixture(scope="module")
def teacher(registry, tiny_bert_dir):
    return registry.create("teacher", "hf", TinyTask(), source=tiny_bert_dir)


def test_prepare_keeps_each_training_sentences_tags_in_a_few_dozen_bytes_and_tags_repeats_once(teacher):
    """prepare reads the sentences as a stream, tags each distinct one once, and keeps its tags for
    the copies that replace its words in about 130 bytes (a list of tag strings under the text
    took about a kilobyte): memory that grows with the training set stays small. The stored tags
    are the tagger's own."""
    import tracemalloc

    pytest.importorskip("spacy")
    augmenter = TangAugmenter(teacher, p_mask=0.0, p_pos=1.0, p_ng=0.0)
    rng = random.Random(0)
    sentences = [" ".join(rng.choices(WORDS, k=15)) for _ in range(3000)]
    augmenter.prepare(iter(sentences[:1000]))  # a warm-up: spaCy's own first-use memory
    tagged = []
    tag_stream = augmenter.tagger.stream
    augmenter.tagger.stream = lambda texts: (tagged.append(t[0]) or t for t in tag_stream(texts))
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        augmenter.prepare(iter(sentences + sentences[:500]))
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sorted(tagged) == sorted(dict.fromkeys(sentences))  # each distinct sentence once
    assert (after - before) / 2000 < 250, after - before  # 3,000 sentences' tags replace 1,000's
    for sentence in sentences[:20]:
        assert augmenter.tags_of(sentence, sentence.split()) == augmenter.tagger([sentence.split()])[0]


def test_masking_and_replacement_rates_are_the_papers():
    """Tang et al. §3.3: per word X ~ U[0,1]; X < p_mask masks, p_mask <= X < p_mask + p_pos replaces."""
    rng = random.Random(0)
    masked = replaced = total = 0
    for _ in range(2000):
        out = mask_or_replace(
            WORDS, rng, p_mask=0.1, p_pos=0.1, mask_token="[MASK]", replacement=lambda position, r: "<R>"
        )
        masked += out.count("[MASK]")
        replaced += out.count("<R>")
        total += len(out)
    assert within(masked, total, 0.1) and within(replaced, total, 0.1)


def test_masking_and_replacement_are_exclusive_and_kept_words_unchanged():
    rng = random.Random(1)
    out = mask_or_replace(WORDS, rng, p_mask=0.5, p_pos=0.5, mask_token="[MASK]", replacement=lambda p, r: "<R>")
    assert set(out) <= {"[MASK]", "<R>"}  # p_mask + p_pos = 1: every word is one or the other, never both
    assert mask_or_replace(WORDS, rng, p_mask=0.0, p_pos=0.0, mask_token="[MASK]") == WORDS


def test_ngram_sampling_draws_n_uniformly_from_1_to_5_and_a_contiguous_span():
    rng = random.Random(2)
    lengths = Counter()
    for _ in range(5000):
        gram = sample_ngram(WORDS, rng, 5)
        lengths[len(gram)] += 1
        start = next(i for i in range(len(WORDS)) if WORDS[i : i + len(gram)] == gram)
        assert WORDS[start : start + len(gram)] == gram
    assert set(lengths) == {1, 2, 3, 4, 5}
    assert all(within(lengths[n], 5000, 0.2) for n in range(1, 6))
    assert sample_ngram(["only", "two"], random.Random(0), 5) in (["only"], ["two"], ["only", "two"])


def test_tang_applies_ngram_sampling_with_p_ng(teacher):
    augmenter = TangAugmenter(teacher, p_mask=0.0, p_pos=0.0, p_ng=0.25)
    shortened = sum(len(augmenter(SENTENCE, random.Random(seed)).split()) < len(WORDS) for seed in range(4000))
    assert within(shortened, 4000, 0.25)


def test_tang_is_deterministic_under_the_rng_and_uses_the_teachers_mask_token(teacher):
    augmenter = TangAugmenter(teacher, p_pos=0.0)
    first = [augmenter(SENTENCE, random.Random(seed)) for seed in range(30)]
    assert first == [augmenter(SENTENCE, random.Random(seed)) for seed in range(30)]
    assert len(set(first)) > 20
    assert any(teacher.tokenizer.mask_token in text for text in first)


def test_pos_replacement_draws_same_tag_words_from_the_training_unigram_distribution(teacher):
    pytest.importorskip("spacy")
    augmenter = TangAugmenter(teacher, p_mask=0.0, p_pos=1.0, p_ng=0.0)
    training = [
        "the movie was good",
        "the film was good",
        "the film was bad",
        "the plot was dull",
        "the film was great",
    ]
    augmenter.prepare(training)
    tags = augmenter.tagger([s.split() for s in training])
    by_tag: dict[str, Counter] = {}
    for sentence, sentence_tags in zip(training, tags):
        for word, tag in zip(sentence.split(), sentence_tags):
            by_tag.setdefault(tag, Counter())[word] += 1
    noun_tag = tags[0][1]  # "movie"
    draws = Counter(augmenter.same_tag_word(noun_tag, random.Random(seed)) for seed in range(6000))
    expected = by_tag[noun_tag]
    assert set(draws) == set(expected)
    total = sum(expected.values())
    for word, count in expected.items():
        assert within(draws[word], 6000, count / total)
    # every word of an augmented sentence is a training word of the original word's tag
    original = "the movie was good"
    for seed in range(50):
        out = augmenter(original, random.Random(seed)).split()
        for word, tag in zip(out, tags[0]):
            assert word in by_tag[tag]


def test_tang_rejects_probabilities_outside_0_1(teacher):
    with pytest.raises(ConfigError, match="p_mask"):
        TangAugmenter(teacher, p_mask=1.5, p_pos=0.0)
    with pytest.raises(ConfigError, match="at most 1"):
        TangAugmenter(teacher, p_mask=0.6, p_pos=0.6)


def test_teacher_words_replaces_with_p_replace_by_embedding_neighbours(registry, teacher):
    augmenter = registry.create("augmenter", "teacher-words", teacher, p_replace=0.4, candidates=3)
    assert augmenter.source == "embeddings"  # the tiny checkpoint has no masked-LM head
    # the 3 nearest whole words by cosine, computed here from the teacher's embedding matrix
    matrix = teacher.model.get_input_embeddings().weight.detach().numpy()
    vocab = teacher.tokenizer.get_vocab()
    special = set(teacher.tokenizer.all_special_ids)
    words = {t: i for t, i in vocab.items() if t.isalpha() and i not in special}
    with np.errstate(invalid="ignore"):  # the padding row is zero; it is no candidate
        unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    for word in ("movie", "good", "dull"):
        scores = {t: float(unit[i] @ unit[vocab[word]]) for t, i in words.items() if t != word}
        expected = sorted(scores, key=scores.get, reverse=True)[:3]
        assert augmenter.neighbours(word) == expected
    changed = total = 0
    kept = {"the", "was", "very", "but", "and", "."}  # stop words and non-words, left alone as TinyBERT's code does
    for seed in range(1500):
        out = augmenter(SENTENCE, random.Random(seed)).split()
        assert len(out) == len(WORDS)
        for original, new in zip(WORDS, out):
            if original in kept:
                assert new == original
            else:
                total += 1
                changed += new != original
                assert new == original or new in augmenter.neighbours(original)
    assert total == 1500 * 7 and within(changed, total, 0.4)


def test_teacher_words_uses_a_masked_lm_head_where_the_checkpoint_has_one(registry, tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    from kdplug.testing.tiny import make_tiny_bert

    directory = make_tiny_bert(tmp_path / "bert", num_layers=2, hidden=32)
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig.from_pretrained(directory)).save_pretrained(directory)
    teacher = registry.create("teacher", "hf", TinyTask(), source=directory)
    augmenter = registry.create("augmenter", "teacher-words", teacher, candidates=4, source="mlm")
    assert augmenter.source == "mlm"
    candidates = augmenter.candidates("the movie was good")
    # the MLM's own top predictions at the masked position, computed here
    tokenizer = teacher.tokenizer
    ids = tokenizer("the movie was good")["input_ids"]
    masked = list(ids)
    masked[2] = tokenizer.mask_token_id  # [CLS] the movie ...: "movie" is position 2
    logits = augmenter.mlm(input_ids=torch.tensor([masked])).logits[0, 2]
    ranked = [
        tokenizer.convert_ids_to_tokens(t)
        for t in logits.topk(12).indices.tolist()
        if t not in tokenizer.all_special_ids and t != ids[2]
    ]
    assert candidates[1] == ranked[:4]
