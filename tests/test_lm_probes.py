"""LM named-entity probes (probes/lm): exposure, zero-shot NET, few-shot NER, readers, sweep.

Three layers of fixtures, cheapest first:
* a stub bigram LM (fixed next-token probabilities) over a tiny WordPiece tokenizer: formulas by hand;
* a tiny GPT-2 trained here on a generated corpus with planted entities (about 20 s on one CPU thread):
  exposure must separate planted from unseen entities;
* the same model and generated CoNLL files through ``orchestrator.driver.lm_sweep.run_lm_sweep`` on the session
  Ray: one uninterrupted sweep, then the fault tests (a worker killed mid-unit, a driver stopped and
  resumed) that must reproduce its table.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from iclmem.errors import ConfigError, DataError
from probes.lm.data import DATASET_FORMATS, Sentence, Span, load_dataset, parse_bio_lines, read_entity_list, write_bio
from probes.lm.exposure import (
    DEFAULT_THRESHOLDS,
    MEMORIZED,
    UNCLASSIFIED,
    UNMEMORIZED,
    ThresholdRule,
    classify,
    compute_exposure,
    exposure_auc,
    rank_exposures,
    tokenize_entity,
)
from probes.lm.model import LanguageModel, greedy_generate, load_lm, token_logprobs
from probes.lm.ner import (
    answer_text,
    build_prompt,
    calibrate,
    f1_from_outcomes,
    is_correct,
    levenshtein,
    make_variant,
    matches_gold,
    outcome,
    sample_examples,
    sample_test,
)
from probes.lm.net import f1_table, predict_types


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    # the CPU is shared; two threads of a tiny model mostly spin-wait
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# =========================================================================================== stub LM
VOCAB = ["[UNK]", "[PAD]", "Great", "Bri", "##tain", "Ann", "##a", "is", "a", "city", "person", "none", "\n",
         "Paris", "N/A", "x"]
ID = {t: i for i, t in enumerate(VOCAB)}


def _stub_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(ID, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")


class BigramLM(torch.nn.Module):
    """Next-token distribution depends only on the previous token: ``probs[prev, next]``."""

    def __init__(self, probs: np.ndarray) -> None:
        super().__init__()
        self.register_buffer("table", torch.log(torch.tensor(probs, dtype=torch.float32)))

    def forward(self, input_ids, attention_mask=None, **_):
        return SimpleNamespace(logits=self.table[input_ids])


def _row(fixed: dict[str, float]) -> np.ndarray:
    """A distribution with the given entries; the rest of the mass spread evenly."""
    row = np.zeros(len(VOCAB))
    rest = [i for i, t in enumerate(VOCAB) if t not in fixed]
    for t, p in fixed.items():
        row[ID[t]] = p
    row[rest] = (1.0 - sum(fixed.values())) / len(rest)
    return row


STUB_ROWS = {
    "[UNK]": {"Great": 0.5},
    "Great": {"Bri": 0.25},
    "Bri": {"##tain": 0.8},
    "##tain": {"Ann": 0.1},
    "Ann": {"##a": 0.5},
    "a": {"city": 0.6, "person": 0.3, "x": 1e-6},
    "person": {"none": 0.6, "x": 0.3},
    "none": {"\n": 0.9},
    "city": {"\n": 0.9},
}


@pytest.fixture(scope="module")
def stub_lm() -> LanguageModel:
    probs = np.stack([_row(STUB_ROWS.get(t, {})) for t in VOCAB])
    return LanguageModel(BigramLM(probs), _stub_tokenizer(), name="stub")


def test_stub_tokenizer_splits_a_word_into_two_pieces(stub_lm):
    t = tokenize_entity(stub_lm, "Great Britain")
    assert [VOCAB[i] for i in t.ids] == ["Great", "Bri", "##tain"]
    assert t.word_index == (0, 1, 1)
    assert t.n_words == 2


def test_word_and_transition_exposure_match_hand_computed_values(stub_lm):
    df = compute_exposure(stub_lm, ["Great Britain", "Great Britain Anna", "Great", "Britain"])
    # "Great Britain": Great is one token (test = 1), Britain's last piece: p(##tain | Bri) = 0.8
    #                  transition: p(Bri | Great) = 0.25
    # "Great Britain Anna": 1 * 0.8 * p(##a | Ann) = 0.4; transitions min(p(Bri|Great)=.25, p(Ann|##tain)=.1)
    # "Great": single token -> 1; one word -> no transition (NaN)
    # "Britain" (after the [UNK] prefix): 0.8; one word -> NaN
    np.testing.assert_allclose(df["word_exposure"], [0.8, 0.4, 1.0, 0.8], rtol=1e-5)
    np.testing.assert_allclose(df["transition_exposure"].iloc[:2], [0.25, 0.1], rtol=1e-5)
    assert df["transition_exposure"].iloc[2:].isna().all()
    # perplexity over the entity's tokens: "Great" alone = -log p(Great | [UNK]) = log 2
    assert df["log_perplexity"].iloc[2] == pytest.approx(math.log(2), rel=1e-5)
    assert list(df["n_tokens"]) == [3, 5, 1, 2]


def test_exposure_is_the_same_with_and_without_leading_space_for_a_whitespace_tokenizer(stub_lm):
    a = compute_exposure(stub_lm, ["Great  Britain"], leading_space=True)
    b = compute_exposure(stub_lm, ["Great Britain"], leading_space=False)
    np.testing.assert_allclose(a[["word_exposure", "transition_exposure"]].to_numpy(),
                               b[["word_exposure", "transition_exposure"]].to_numpy())


def test_rank_exposure_is_log2_set_size_minus_log2_rank():
    np.testing.assert_allclose(rank_exposures([1.0, 2.0, 3.0, 4.0]), [2.0, 1.0, 2 - math.log2(3), 0.0])
    # ties share the best rank
    np.testing.assert_allclose(rank_exposures([1.0, 1.0, 2.0]), [math.log2(3), math.log2(3), 0.0])
    # against a separate candidate set S (the value counts as a member of S)
    np.testing.assert_allclose(rank_exposures([0.5], candidates=[1.0, 2.0, 3.0]), [2.0])


def test_thresholds_are_inclusive_and_nan_is_unclassified():
    rule = ThresholdRule("word", 0.8, 1e-4)
    got = classify([0.8, 0.79, 1e-4, 2e-4, float("nan")], rule)
    assert list(got) == [MEMORIZED, UNCLASSIFIED, UNMEMORIZED, UNCLASSIFIED, UNCLASSIFIED]
    with pytest.raises(ConfigError):
        ThresholdRule("word", 1e-4, 0.8)


def test_default_thresholds_follow_the_papers_tables_8_and_9():
    assert DEFAULT_THRESHOLDS["conll2003"] == (ThresholdRule("word", 0.8, 1e-4),)
    # the paper ignores one-word entities of MIT Movie and DBpedia (min_words=2)
    assert DEFAULT_THRESHOLDS["mit_movie"] == (ThresholdRule("transition", 1e-3, 1e-5, min_words=2),)
    assert DEFAULT_THRESHOLDS["entity_list"] == (ThresholdRule("word", 1.0, 1e-6, min_words=2),
                                                 ThresholdRule("transition", 0.01, 1e-6, min_words=2))


def test_net_predicts_the_type_of_the_lowest_perplexity_keyword(stub_lm):
    pred = predict_types(stub_lm, ["Great Britain", "Paris"], ["person", "location"],
                         keywords={"person": ["person"], "location": ["city"]})
    # "... is a city" (p=0.6) beats "... is a person" (p=0.3); all other tokens are shared
    assert list(pred["predicted"]) == ["location", "location"]
    assert list(pred["keyword"]) == ["city", "city"]


def test_net_f1_per_type_and_macro_average_by_hand():
    t = f1_table(["person", "person", "location", "location"], ["person", "location", "location", "location"],
                 ["person", "location"]).set_index("entity_type")
    assert t.loc["person", "f1"] == pytest.approx(2 / 3)  # P = 1, R = 1/2
    assert t.loc["location", "f1"] == pytest.approx(0.8)  # P = 2/3, R = 1
    assert t.loc["macro-average", "f1"] == pytest.approx((2 / 3 + 0.8) / 2)
    assert t.loc["macro-average", "count"] == 4
    assert t.loc["person", "baseline_f1"] == pytest.approx(0.5)
    assert f1_table([], [], ["person"]).empty


# =========================================================================================== calibration
def test_calibration_with_a_known_content_free_distribution():
    p = np.array([0.5, 0.3, 0.2])
    p_cf = np.array([0.7, 0.2, 0.1])
    w_p = p / p_cf  # W = diag(p_cf)^-1 -> [0.714, 1.5, 2.0]
    np.testing.assert_allclose(calibrate(p, p_cf, "normalize"), w_p / w_p.sum())
    np.testing.assert_allclose(calibrate(p, p_cf, "softmax"), np.exp(w_p) / np.exp(w_p).sum())
    assert np.argmax(p) == 0
    assert np.argmax(calibrate(p, p_cf)) == 2
    # a uniform content-free distribution changes nothing
    np.testing.assert_allclose(calibrate(p, np.full(3, 1 / 3), "normalize"), p)


def test_calibration_applies_to_the_first_generated_token_only(stub_lm):
    prompt = [stub_lm.prefix_id, ID["Great"], ID["is"], ID["a"]]
    assert [VOCAB[i] for i in greedy_generate(stub_lm, [prompt], 15)[0]] == ["city", "\n"]
    p_cf = _row({"city": 0.9, "person": 0.05, "x": 1e-4})
    gen = greedy_generate(stub_lm, [prompt, prompt[1:]], 15, first_token_bias=-np.log(p_cf))
    # step 1: person (0.3 / 0.05 = 6) beats city (0.6 / 0.9); step 2 is plain greedy: "none" (0.6), not
    # "x" (0.3 / 1e-4 would win if the calibration were applied again)
    assert [VOCAB[i] for i in gen[0]] == ["person", "none", "\n"] == [VOCAB[i] for i in gen[1]]
    assert answer_text(stub_lm, gen[0]) == "person none"
    # at most max_new_tokens
    assert len(greedy_generate(stub_lm, [prompt], 1, first_token_bias=-np.log(p_cf))[0]) == 1


# =========================================================================================== matching
def test_levenshtein_distance_small_cases():
    assert levenshtein("", "abc") == 3
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("flaw", "lawn") == 2
    assert levenshtein("same", "same") == 0


def test_matching_is_case_insensitive():
    assert matches_gold("new YORK", "New York")
    assert is_correct("NONE", [], "some text here")


def test_levenshtein_ratio_boundary_is_strictly_below_0_2():
    assert not matches_gold("abcdx", "abcde")  # 1 / 5 = 0.2: not < 0.2
    assert matches_gold("abcdex", "abcdef")  # 1 / 6
    assert matches_gold("ZuneHD", "Zune HD")  # a dropped space: 1 / 7


def test_no_gold_entity_none_or_an_answer_sharing_no_word_is_correct():
    text = "we met in Paris last year"
    assert is_correct("none", [], text)
    assert is_correct("London", [], text)  # no word in common with the input
    assert not is_correct("Paris", [], text)
    assert not is_correct("none", ["Paris"], text)
    assert is_correct("paris", ["Berlin", "Paris"], text)  # any one gold entity


def test_ner_f1_counts_a_wrong_entity_as_false_positive_and_false_negative():
    outs = [outcome("Paris", ["Paris"], "x Paris"),  # TP
            outcome("none", ["Rome"], "x Rome"),  # FN
            outcome("Oslo x", ["Rome"], "x Rome"),  # FP + FN
            outcome("x", [], "x y"),  # FP (shares a word)
            outcome("none", [], "x y")]  # TN
    s = f1_from_outcomes(outs)
    assert (s["tp"], s["fp"], s["fn"], s["tn"]) == (1, 2, 2, 1)
    assert s["f1"] == pytest.approx(2 / (2 + 2 + 2))


# =========================================================================================== readers
CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP I-ORG
rejects VBZ B-VP O
German JJ B-NP I-MISC
call NN I-NP O
to TO B-VP O
Peter NNP B-NP I-PER
Blackburn NNP I-NP I-PER

New NNP B-NP B-LOC
York NNP I-NP I-LOC
and CC O O
Boston NNP B-NP B-LOC
"""


def test_conll_reader_handles_docstart_iob1_and_drops_misc():
    sents = parse_bio_lines(CONLL.splitlines(True), DATASET_FORMATS.get("conll2003"))
    assert len(sents) == 2
    assert sents[0].entities() == ["EU", "Peter Blackburn"]
    assert [s.type for s in sents[0].spans] == ["organisation", "person"]
    assert sents[1].entities("location") == ["New York", "Boston"]


def test_mit_movie_reader_reads_tag_first_and_merges_slots():
    lines = ["B-ACTOR\tsteve", "I-ACTOR\tmcqueen", "O\tin", "B-TITLE\tbullitt", "O\tby", "B-DIRECTOR\tpeter",
             "I-DIRECTOR\tyates", "B-GENRE\tthriller", "", "B-Song\tmy\tignored"]
    sents = parse_bio_lines(lines, DATASET_FORMATS.get("mit_movie"))
    assert sents[0].entities("person") == ["steve mcqueen", "peter yates"]
    assert sents[0].entities("creative work") == ["bullitt"]
    assert all(s.type != "genre" for s in sents[0].spans)
    assert sents[1].entities("creative work") == ["my"]  # case-insensitive slot names


def test_wnut_reader_maps_creative_work_and_keeps_its_six_types():
    lines = ["Watching\tO", "Star\tB-creative-work", "Wars\tI-creative-work", "at\tO", "Apple\tB-corporation"]
    s = parse_bio_lines(lines, DATASET_FORMATS.get("wnut2017"))[0]
    assert s.entities("creative work") == ["Star Wars"]
    assert s.entities("corporation") == ["Apple"]


def test_entity_list_reader_and_its_errors(tmp_path):
    f = tmp_path / "dbpedia.tsv"
    f.write_text("# comment\nAlan Turing\tPerson\nParis\tlocation\nAcme  Corp\tOrganization\n\n")
    df = read_entity_list(f)
    assert set(map(tuple, df.to_numpy())) == {("Alan Turing", "person"), ("Paris", "location"),
                                              ("Acme Corp", "organisation")}
    bad = tmp_path / "bad.tsv"
    bad.write_text("Alan Turing person\n")
    with pytest.raises(DataError, match="bad.tsv:1"):
        read_entity_list(bad)


def test_dataset_folder_splits_by_file_name_and_checks_types(tmp_path):
    s = Sentence(("Ann", "met", "Bob"), (Span(0, 1, "person"), Span(2, 3, "person")))
    write_bio([s], tmp_path / "eng.train")
    write_bio([s, s], tmp_path / "eng.testb")
    write_bio([s, s, s], tmp_path / "eng.testa")  # original CoNLL-2003 names: testa = dev, testb = test
    ds = load_dataset(tmp_path, "conll2003", "toy")
    assert len(ds.train) == 1
    assert len(ds.test) == 2
    assert len(ds.splits["dev"]) == 3
    assert ds.supports_ner
    assert list(ds.entities()["entity"]) == ["Ann", "Bob"]
    with pytest.raises(DataError, match="location"):
        load_dataset(tmp_path, "conll2003", "toy", ["location"])
    with pytest.raises(ConfigError):  # unknown format name
        load_dataset(tmp_path, "conll2004")


# =========================================================================================== NER sampling
def _toy_sentences(n_pos: int, n_neg: int) -> list[Sentence]:
    pos = [Sentence(("Ann", "Lee", "saw", f"w{i}"), (Span(0, 2, "person"),)) for i in range(n_pos)]
    neg = [Sentence(("Rome", "is", f"v{i}"), (Span(0, 1, "location"),)) for i in range(n_neg)]
    return pos + neg


def test_example_sampling_takes_9_positives_and_7_random_and_formats_the_prompt():
    train = _toy_sentences(20, 20)
    ex = sample_examples(train, "person", seed=0)
    assert len(ex) == 16
    assert sum(s.has_type("person") for s in ex) >= 9
    assert sample_examples(train, "person", seed=0) == ex
    assert sample_examples(train, "person", seed=1) != ex
    prompt = build_prompt(ex[:2], "person", "Rome is v1")
    lines = prompt.split("\n")
    assert lines[0].startswith("Sentence:\t")
    assert lines[1].startswith("person:\t")
    assert lines[-2] == "Sentence:\tRome is v1"
    assert lines[-1] == "person:\t"
    answers = [ln.split("\t", 1)[1] for ln in lines[1:4:2]]
    assert all(a in ("Ann Lee", "none") for a in answers)


def test_test_sampling_keeps_all_positives_with_about_half_as_many_negatives():
    test = _toy_sentences(10, 30)
    got = sample_test(test, "person", seed=0)
    assert sum(s.has_type("person") for s in got) == 10
    assert len(got) == 15
    capped = sample_test(test, "person", seed=0, max_sentences=6)
    assert len(capped) == 6
    assert sum(s.has_type("person") for s in capped) == 4


def test_seen_and_unseen_variants_replace_every_entity():
    sents = _toy_sentences(3, 2)
    seen = make_variant(sents, "seen", 0, {"person": ["Mary Jones"], "location": ["Oslo"]})
    assert all(s.entities("person") == ["Mary Jones"] for s in seen[:3])
    assert all(s.entities("location") == ["Oslo"] for s in seen[3:])
    unseen = make_variant(sents, "unseen", 0, vocabulary={"ann", "lee"})
    for s in unseen:
        (ent,) = s.entities()
        assert ent.isalpha()
        assert ent.islower()
        assert len(ent) == 8
    assert make_variant(sents, "as-is", 0) == sents


# =========================================================================================== planted ground truth
@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A tiny GPT-2 trained on a corpus where 16 persons, locations and organisations are planted."""
    from probes.lm.synthetic import corpus_sentences, make_world, ner_format_texts, train_tiny_gpt2

    world = make_world(0)
    texts = [s.text for s in corpus_sentences(world, n=1200, seed=1)] + ner_format_texts(world, n=60, seed=4)
    path = train_tiny_gpt2(texts, tmp_path_factory.mktemp("tiny_gpt2"), seed=0, steps=200)
    return SimpleNamespace(world=world, path=path)


@pytest.mark.slow  # trains a GPT-2 (`make test-fast` leaves it out)
def test_exposure_ranks_planted_entities_above_unseen_ones(planted):
    lm = load_lm(planted.path, cache=False)  # local directory, local_files_only
    w = planted.world
    persons, recombined, random = list(w.planted["person"]), list(w.recombined), list(w.random)
    df = compute_exposure(lm, persons + recombined + random)
    n = len(persons)
    p, r, x = df.iloc[:n], df.iloc[n:2 * n], df.iloc[2 * n:]
    # unknown words: word exposure separates planted entities from random strings
    assert exposure_auc(p["word_exposure"], x["word_exposure"]) >= 0.9
    # known words in an unseen order: only the transition exposure can tell
    assert exposure_auc(p["transition_exposure"], r["transition_exposure"]) >= 0.9
    # Carlini rank exposure among all candidates
    assert exposure_auc(p["rank_exposure"], df.iloc[n:]["rank_exposure"]) >= 0.9
    # CoNLL thresholds: no random string is classified memorized, most planted persons are
    cls = classify(df["word_exposure"], DEFAULT_THRESHOLDS["conll2003"][0])
    assert MEMORIZED not in set(cls[2 * n:])
    assert (cls[:n] == MEMORIZED).mean() >= 0.8


def test_batched_scoring_and_generation_equal_one_sequence_at_a_time(planted):
    lm = load_lm(planted.path)
    ents = list(planted.world.planted["organisation"][:5]) + list(planted.world.random[:5])
    a = compute_exposure(lm, ents, batch_size=64)
    b = compute_exposure(lm, ents, batch_size=1)
    np.testing.assert_allclose(a[["word_exposure", "log_perplexity"]].to_numpy(),
                               b[["word_exposure", "log_perplexity"]].to_numpy(), rtol=1e-4, atol=1e-9)
    prompts = [[lm.prefix_id, *lm.encode(t)] for t in ("Sentence:\tyesterday", "the weather in", "we went")]
    assert greedy_generate(lm, prompts, 6, batch_size=3) == greedy_generate(lm, prompts, 6, batch_size=1)
    seqs = [[lm.prefix_id, *lm.encode("a b c d e")], [lm.prefix_id]]
    assert [len(v) for v in token_logprobs(lm, seqs)] == [len(seqs[0]) - 1, 0]


# =========================================================================================== sweep
def _write_sweep(tmp_path: Path, planted, extra: str = "") -> Path:
    from probes.lm.synthetic import dataset_sentences

    data = tmp_path / "conll"
    write_bio(dataset_sentences(planted.world, 60, seed=2), data / "train.txt")
    write_bio(dataset_sentences(planted.world, 30, seed=3), data / "test.txt")
    ents = tmp_path / "entities.tsv"
    ents.write_text("".join(f"{e}\t{t}\n" for t, es in planted.world.planted.items() for e in es[:6])
                    + "".join(f"{e}\t{t}\n" for t, es in planted.world.held_out.items() for e in es[:4]))
    cfg = tmp_path / "lm.yaml"
    cfg.write_text(f"""
name: lm-test
models:
  - name: tiny
    path: {planted.path}
datasets:
  - name: toy-conll
    path: conll
    format: conll2003
  - name: toy-list
    path: entities.tsv
    format: entity_list
probes: [exposure, net, ner]
seeds: [0, 1]
ner:
  max_test_sentences: 6
  batch_size: 6
resources:
  probe_actors: 2
  cpus_per_probe_actor: 0.5
{extra}""")
    return cfg


@pytest.fixture(scope="module")
def sweep_file(planted, tmp_path_factory) -> Path:
    return _write_sweep(tmp_path_factory.mktemp("lm_sweep"), planted)


@pytest.fixture(scope="module")
def clean_run(sweep_file, ray_session, tmp_path_factory):
    """One uninterrupted LM sweep: the reference the fault tests compare against."""
    from orchestrator.driver.lm_sweep import run_lm_sweep

    run = tmp_path_factory.mktemp("lm_clean") / "run"
    return SimpleNamespace(dir=run, results=run_lm_sweep(sweep_file, run, log=lambda _line: None))


def _stored_units(run: Path) -> dict[Path, tuple[int, int]]:
    """Every stored unit result (its JSON is written last) -> (inode, mtime_ns): a rewrite changes either."""
    from iclmem.runfolder import LM_UNITS_DIR

    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (run / LM_UNITS_DIR).glob("*/*.json")}


def _without_wandb(sweep_file: Path):
    """The sweep file's config with W&B off: what the fault tests compare is the results table."""
    from iclmem.vocab import WandbMode
    from orchestrator.schema.sweep_files import load_lm_sweep

    cfg = load_lm_sweep(sweep_file)
    return cfg.model_copy(update={"wandb": cfg.wandb.model_copy(update={"mode": WandbMode.DISABLED})})


def _same_results(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    try:
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    except AssertionError:
        return False
    return True


@pytest.mark.slow  # end to end: LM sweeps on the probe pool (`make test-fast` leaves them out)
@pytest.mark.ray
def test_run_lm_sweep_runs_net_and_ner_and_writes_report_tables(planted, clean_run):
    from iclmem.provenance import Provenance
    from iclmem.runfolder import LM_EXPOSURE_DIR, LM_REPORT_FILE, LM_RESULTS_FILE
    from orchestrator.driver.lm_sweep import RESULT_COLUMNS
    from probes.lm.report import lm_tables

    run, df = clean_run.dir, clean_run.results
    assert tuple(df.columns) == RESULT_COLUMNS
    stored = pd.read_parquet(run / LM_RESULTS_FILE)
    pd.testing.assert_frame_equal(stored, df)
    assert not list(run.rglob(".*tmp"))  # atomic writes left no temporary file

    assert set(df["probe"]) == {"exposure", "net", "ner"}
    scored = df[df["probe"].isin(["net", "ner"])]
    f1 = scored["f1"].dropna()
    assert len(f1) > 0
    assert f1.between(0, 1).all()
    ner = df[df["probe"] == "ner"]
    assert set(ner["variant"]) == {"as-is", "seen", "unseen"}
    assert set(ner["seed"]) == {0, 1}
    assert set(ner["entity_type"]) == {"person", "location", "organisation"}
    assert ner[ner["variant"] == "as-is"]["f1"].notna().all()

    tables = lm_tables(df)
    assert list(tables["table2"].columns) == ["model", "dataset", "criterion", "entity_type", "f1_all", "count_all",
                                              "f1_memorized", "count_memorized", "f1_unmemorized",
                                              "count_unmemorized"]
    assert set(tables["table3"]["criterion"]) == {"word", "transition"}  # entity list: both criteria
    assert list(tables["table4"].columns) == ["model", "dataset", "entity_type", "f1", "f1_random_guess", "count"]
    assert "macro-average" in set(tables["table4"]["entity_type"])
    t5 = tables["table5"]
    for v in ("as_is", "seen", "unseen"):
        assert {f"f1_{v}_mean", f"f1_{v}_std"} <= set(t5.columns)
    assert len(t5) == 3
    assert (t5["n_seeds"] == 2).all()
    assert list(tables["table6"].columns) == ["model", "dataset", "entity_type", "f1_mean", "f1_std", "count",
                                              "n_seeds"]
    for t in tables.values():
        for c in [c for c in t.columns if c.startswith("f1")]:
            assert t[c].dropna().between(0, 1).all()

    # The provenance record of an LM run folder, written by the driver and shown in the report.
    record = Provenance.read(run)
    assert record is not None
    assert record.kind == "lm"
    assert record.sweep_name == "lm-test"
    assert "transformers" in record.packages
    assert "torch" in record.packages
    page = (run / LM_REPORT_FILE).read_text()
    assert "Table 2" in page
    assert "Table 5" in page
    assert "Table 6" in page
    assert f"package transformers</dt><dd>{record.packages['transformers']}" in page

    # The W&B summary run (offline) holds the results table, the provenance and the report artifact.
    from synthetic_run_dir import read_wandb_records

    logs = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1
    text = "\n".join(str(r) for r in read_wandb_records(logs[0]))
    assert "lm_results" in text
    assert "mean_f1/net" in text
    assert "iclmem-lm-" in text
    assert record.config_hash in text
    # raw data stays out of the report: no template sentence, no entity string
    assert "bought some bread" not in page
    assert planted.world.planted["person"][0] not in page
    lists = list((run / LM_EXPOSURE_DIR).glob("*.tsv"))
    assert len(lists) == 2
    exp = pd.read_csv(run / LM_EXPOSURE_DIR / "tiny__toy-conll.tsv", sep="\t")
    assert {"entity", "word_exposure", "transition_exposure", "rank_exposure", "class_word"} <= set(exp.columns)


@pytest.mark.slow  # end to end: LM sweeps on the probe pool (`make test-fast` leaves them out)
@pytest.mark.ray
def test_an_lm_worker_killed_mid_unit_is_restarted_and_the_sweep_finishes_identically(
        sweep_file, clean_run, tmp_path, fault_ledger):
    """SIGKILL of an LM worker actor's process while it runs a unit: Ray restarts the actor, the pool gets
    the unit computed again, and the table equals the uninterrupted run's."""
    import os
    import signal
    import threading

    import psutil

    from orchestrator.driver.lm_sweep import run_lm_sweep

    killed: list[int] = []
    stop = threading.Event()

    def kill_a_worker_mid_unit() -> None:
        # Ray titles an actor's process "ray::<Class>.<method>" while a call runs: the unit is under way.
        while not stop.is_set():
            for proc in psutil.process_iter(["pid", "cmdline"]):
                if "ray::LMUnitWorker.run" in " ".join(proc.info["cmdline"] or ()):
                    os.kill(proc.info["pid"], signal.SIGKILL)
                    killed.append(proc.info["pid"])
                    return
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_a_worker_mid_unit, daemon=True)
    watcher.start()
    try:
        df = run_lm_sweep(sweep_file, tmp_path / "run", config=_without_wandb(sweep_file), log=lambda _line: None)
    finally:
        stop.set()
        watcher.join(timeout=10)
    assert killed, "no LM worker was seen running a unit"
    assert len(_stored_units(tmp_path / "run")) == len(_stored_units(clean_run.dir))
    identical = _same_results(df, clean_run.results)
    fault_ledger(injected=1, completed=True, identical=identical)
    assert identical, "the table after a killed worker differs from the uninterrupted run's"


class DriverKilled(BaseException):
    """Stands for the driver process dying: not an Exception, so nothing in the driver catches it."""


@pytest.mark.slow  # end to end: LM sweeps on the probe pool (`make test-fast` leaves them out)
@pytest.mark.ray
def test_an_interrupted_lm_sweep_resumes_computing_only_the_missing_units(
        sweep_file, clean_run, tmp_path, monkeypatch, fault_ledger):
    """The driver stops after a few units are stored (its pool is lost with it); ``iclmem lm resume``
    reads the stored config, computes only the units not stored and writes the same table."""
    from iclmem.runfolder import LM_RESULTS_FILE
    from orchestrator import cli
    from orchestrator.driver import lm_sweep

    real_start = lm_sweep.start_lm_pool

    def pool_that_dies_after_three_units(cfg, inputs):
        pool = real_start(cfg, inputs)
        poll, reported = pool.poll, []

        def poll_then_die(timeout: float = 0.0, max_attempts: int = 3):
            rows = poll(timeout, max_attempts)  # these units are stored now
            reported.extend(rows)
            if len(reported) >= 3:
                raise DriverKilled()
            return rows

        pool.poll = poll_then_die
        return pool

    run = tmp_path / "run"
    monkeypatch.setattr(lm_sweep, "start_lm_pool", pool_that_dies_after_three_units)
    with pytest.raises(DriverKilled):
        lm_sweep.run_lm_sweep(sweep_file, run, config=_without_wandb(sweep_file), log=lambda _line: None)
    monkeypatch.undo()
    before = _stored_units(run)
    total = len(_stored_units(clean_run.dir))
    assert 3 <= len(before) < total
    assert not (run / LM_RESULTS_FILE).exists()

    assert cli.main(["lm", "resume", str(run), "--quiet"]) == 0
    after = _stored_units(run)
    assert {p: after[p] for p in before} == before  # no stored unit was computed or written again
    assert len(after) == total
    identical = _same_results(pd.read_parquet(run / LM_RESULTS_FILE), clean_run.results)
    fault_ledger(injected=1, completed=True, identical=identical)
    assert identical, "the resumed table differs from the uninterrupted run's"


def test_a_stored_unit_that_fails_its_checksum_is_not_returned(tmp_path):
    from probes.lm.units import LMUnitResult

    table = pd.DataFrame({"entity": ["Ann Lee", "Rome"], "word_exposure": [0.9, 1e-5]})
    LMUnitResult({"probe": "exposure", "model": "m", "dataset": "d"}, table).save(tmp_path, "u")
    loaded = LMUnitResult.load(tmp_path, "u")
    assert loaded is not None
    assert loaded.row["model"] == "m"
    pd.testing.assert_frame_equal(loaded.table, table)
    assert LMUnitResult.load(tmp_path, "other") is None
    data = (tmp_path / "u.parquet").read_bytes()
    (tmp_path / "u.parquet").write_bytes(data[:-9] + bytes([data[-9] ^ 1]) + data[-8:])
    with pytest.warns(UserWarning, match="fails its checksum"):
        assert LMUnitResult.load(tmp_path, "u") is None


def test_lm_resume_refuses_a_folder_that_is_not_an_lm_run(tmp_path):
    from iclmem.provenance import Provenance
    from orchestrator.driver.lm_sweep import run_lm_sweep

    with pytest.raises(ConfigError, match="not an iclmem LM run folder"):
        run_lm_sweep(None, tmp_path, resume=True)
    Provenance.collect(kind="tabular", sweep_name="qs", config={}, config_hash="abc", seeds=[0]).write(tmp_path)
    with pytest.raises(ConfigError, match=f"iclmem resume {tmp_path}"):
        run_lm_sweep(None, tmp_path, resume=True)


def test_sweep_file_mistakes_are_all_reported_before_any_work(tmp_path):
    from orchestrator.driver.lm_sweep import run_lm_sweep
    from orchestrator.schema.sweep_files import load_lm_sweep

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("""
models: [{path: a, builtin: synthetic}]
datasets: [{name: d, path: x, format: conll2004}]
probes: [exposure, typing]
seeds: []
ner: {variants: [as-is, seen-twice]}
resources: {probe_actor: 2}
""")
    with pytest.raises(ConfigError) as err:
        load_lm_sweep(cfg)
    msg = str(err.value)
    for where in ("models.0", "datasets.0.format", "probes.1", "seeds", "ner.variants.1",
                  "resources.probe_actor: unknown setting"):
        assert where in msg
    ok = tmp_path / "ok.yaml"
    ok.write_text("models: [{path: nowhere}]\ndatasets: [{name: d, path: nothing, format: conll2003}]\n")
    with pytest.raises(ConfigError, match="nowhere"):
        run_lm_sweep(ok, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything was written
