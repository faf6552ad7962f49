"""Closed vocabularies, declared once. Config ``Literal``s, report columns, W&B keys and the math all
derive from these enums; a string that is not a member is refused where it enters (pydantic at the config
boundary, ``Enum(value)`` elsewhere). They are ``str`` enums so that a value compares equal to, hashes and
serialises as its plain string: a sweep's config hash does not change when a field becomes an enum."""

from __future__ import annotations

from enum import Enum


class Vocab(str, Enum):
    """A closed vocabulary whose members print, format and serialise as their plain value (so an
    f-string or a path built from one reads ``single_fixed``, not ``Regime.SINGLE_FIXED``)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class TaskKind(Vocab):
    CLASSIFICATION = "classification"
    REGRESSION = "regression"


class LabelMode(Vocab):
    """Which labels fine-tuning sees (spec "Label randomization")."""

    NORMAL = "normal"
    SHUFFLED_MEMBERS = "shuffled_members"
    SHUFFLED_ALL = "shuffled_all"


class LabelDesign(Vocab):
    """Which labels the non-members (and every row outside members and C') are scored on under
    ``shuffled_members`` (docs/METHOD.md, "Exchangeable members and non-members").

    ``matched`` (default): the non-members' labels are permuted among themselves, and so are those of the
    rows no part of the split uses (the null splits' pool), each by a stream of its own, exactly as the
    members' are: before training, which row of a (member, non-member) pair is trained on is a fair coin,
    labels as scored included. ``unmatched``: the paper's design, non-members keep their true labels; the
    two groups then differ in label correctness before any training (a classifier on C' alone separates
    them), kept only to reproduce the paper. The other label modes treat every row alike already, so the
    setting changes nothing there."""

    MATCHED = "matched"
    UNMATCHED = "unmatched"


class SourceKind(Vocab):
    """Where a table comes from."""

    CARTE = "carte"
    TABLE = "table"
    BUILTIN = "builtin"


class InputContract(Vocab):
    """What a model is built to read; each adapter declares one (``ModelAdapter.input_contract``), and Stage
    I prepares every task once per contract (``trainables.data.contract_settings``).

    ``reduced``: every column encoded to standardised numbers (one-hot / ordinal / days), then whitened PCA
    down to ``data.max_features`` (pfn-mini, a small fixed-width model). ``numeric``: the same encoding
    without PCA unless the encoded table exceeds the model's own feature limit minus the probe's distractor
    columns (TabICL, TabPFN v2). ``cells``: one feature per real table column -- numbers standardised once
    over the table, text as a code into the column's vocabulary of cell strings, dates as whole days since
    1970-01-01 -- never reduced (ConTextTab, which reads column names, text and dates itself)."""

    REDUCED = "reduced"
    NUMERIC = "numeric"
    CELLS = "cells"


class ColumnKind(Vocab):
    """What one prepared feature column holds (``trainables.data.FeatureColumn``)."""

    NUMBER = "number"  # a standardised number (a numeric cell, or an encoded one: one-hot, rank, days, missing flag)
    TEXT = "text"  # an integer code into the column's vocabulary of cell strings (cells contract)
    DATE = "date"  # whole days since 1970-01-01, UTC (cells contract)
    COMPONENT = "component"  # a PCA component mixing every encoded column


class Regime(Vocab):
    """Fine-tuning regimes (spec "Fine-tuning", paper App. 10)."""

    SINGLE_FIXED = "single_fixed"
    MULTI_FIXED = "multi_fixed"
    MULTI_RANDOM = "multi_random"
    # no fine-tuning: the model deployed with Q rows of a task as its context, audited for which rows they
    # were (orchestrator.audits.context_audit; one audit per task, model, Q and seed)
    CONTEXT = "context"


MAIN_REGIME = Regime.SINGLE_FIXED  # the paper's main regime


class Recipe(Vocab):
    """Who fine-tunes a model (``models[].recipe``): iclmem's own loop (one step on C' with the members as
    queries, raw logits scored) or the package's own fine-tuner with its defaults, scored as the package's
    estimator deploys it (its preprocessing and ensemble, ``predict_proba``) -- ``trainables.upstream``."""

    ICLMEM = "iclmem"
    UPSTREAM = "upstream"
# The ``regime`` of a results row for the untouched base model probed as epoch 0 (the pipeline sanity
# check, ΔS ≡ 0 by construction): a row label, never a training regime.
BASE_MODEL_ROW = "base"


class ScoreKind(Vocab):
    """The three per-(query, manipulation) scores of the probe (spec "Scores")."""

    LOSS = "loss"  # -log p(y*)
    ENTROPY = "entropy"  # H(p) over the candidate set
    CONFIDENCE = "confidence"  # p(y*)


SCORE_KINDS: tuple[ScoreKind, ...] = tuple(ScoreKind)


class Calibration(Vocab):
    """Which per-query score a metric is computed on (spec "Metrics", paper App. 7.4)."""

    CALIBRATED = "calibrated"  # Delta S = S - S_ref
    UNCALIBRATED = "uncalibrated"  # S alone (fine-tuned model)
    REFERENCE_ONLY = "reference_only"  # S_ref alone (base model)


class Outcome(Vocab):
    """Checkpoint outcomes, declared in the spec's precedence order: the first rule that holds wins."""

    COLLAPSE = "collapse"
    MEMORIZATION = "memorization"
    INVERSION = "inversion"
    OVERFITTING = "overfitting"
    NO_SIGNAL = "no_signal"


PRECEDENCE: tuple[Outcome, ...] = tuple(Outcome)  # the order the classifier tries the rules in
DETECTABLE = Outcome.MEMORIZATION


class OutcomeRule(Vocab):
    """Which memorization rule decides a verdict (docs/METHOD.md, "Verdict rules").

    ``paper``: the paper's rule on each checkpoint alone (AUC and TPR@alpha margin; strict mode adds the
    AUC interval). ``selection_aware``: the paper's rule AND a one-sided Mann-Whitney p-value of the
    deciding (checkpoint, score kind) below ``family_alpha / K``, K = checkpoints x competing score kinds
    of the run (Bonferroni), so the run headline, which picks the maximum over that family, keeps a
    false-positive rate of at most ``family_alpha``."""

    PAPER = "paper"
    SELECTION_AWARE = "selection_aware"


class VerdictRule(Vocab):
    """The rules whose false-positive rate every sweep measures on its null splits."""

    PAPER = "paper"
    PAPER_STRICT = "paper_strict"
    SELECTION_AWARE = "selection_aware"
    SELECTION_AWARE_STRICT = "selection_aware_strict"

    @property
    def rule(self) -> OutcomeRule:
        return OutcomeRule.PAPER if self.value.startswith("paper") else OutcomeRule.SELECTION_AWARE

    @property
    def strict(self) -> bool:
        return self.value.endswith("_strict")

    @classmethod
    def of(cls, rule: OutcomeRule | str, strict: bool) -> VerdictRule:
        return cls(f"{OutcomeRule(rule).value}{'_strict' if strict else ''}")


class LMProbe(Vocab):
    """The LM probe family's work-unit kinds (LM_PROBE_SPEC.md): entity exposure, zero-shot named-entity
    typing (NET) and few-shot NER."""

    EXPOSURE = "exposure"
    NET = "net"
    NER = "ner"


class NerVariant(Vocab):
    """Few-shot NER test sets: the sentences as they are, with their entities replaced by memorized ones,
    or by made-up non-words."""

    AS_IS = "as-is"
    SEEN = "seen"
    UNSEEN = "unseen"


class ExposureMetric(Vocab):
    """Which exposure an entity is classified on (paper Tables 8-9)."""

    WORD = "word"
    TRANSITION = "transition"


class ExposureClass(Vocab):
    """An entity's class under an exposure threshold rule."""

    MEMORIZED = "memorized"
    UNMEMORIZED = "unmemorized"
    UNCLASSIFIED = "unclassified"


class TrialRole(Vocab):
    """What a fine-tuning trial is for: an audited run, or one of its reference models (probe.references)."""

    TARGET = "target"
    REFERENCE = "reference"


class Attack(Vocab):
    """Reference-model membership attacks (probes/attacks/membership.py); their results columns are ``<value>_*``."""

    LIRA_ONLINE = "lira_online"  # Carlini et al.: per-query Gaussians fitted to in- and out-reference statistics
    LIRA_OFFLINE = "lira_offline"  # one-sided test against the out-reference Gaussian only
    RMIA = "rmia"  # Zarifzadeh et al.: likelihood ratio against the references, compared over a population


class ContextAttack(Vocab):
    """The attacks of the deployed-context audit (probes/attacks/context.py): is a row in a fitted in-context
    learner's context? A reference is the same weights with another context; the last three are
    :class:`Attack`'s, on those references."""

    LOSS = "loss"  # the known-context loss: log p(y*) under the deployed context, nothing else
    CALIBRATED_LOSS = "calibrated_loss"  # log p(y*) minus its mean under the reference contexts that lacked the row
    LIRA_ONLINE = Attack.LIRA_ONLINE.value
    LIRA_OFFLINE = Attack.LIRA_OFFLINE.value
    RMIA = Attack.RMIA.value


class ContextTarget(Vocab):
    """What the deployed-context audit attacks: the deployed context (members = its rows), or the control, a
    context of the same size and label counts holding none of the audited rows (every attack must say
    ``no_signal`` there, or no verdict of the audit is trusted)."""

    DEPLOYED = "deployed"
    CONTROL = "never_in_context"


class CanaryKind(Vocab):
    """Crafted rows a sweep can insert into a run's fine-tuning members (trainables/canaries.py)."""

    OUTLIER = "outlier"  # features far outside the table (4-6 standard deviations per number), a random label
    RARE_LABEL = "rare_label"  # a real row's features (slightly jittered) under the members' rarest label


class CanaryDesign(Vocab):
    """How a sweep's canaries are inserted (trainables/canaries.py)."""

    # per kind, a fixed number per copy count (1, 2, 4, 8 copies) and held-out ones: exposure and its rank test
    EXPOSURE = "exposure"
    # per kind, m canaries each inserted once with probability 1/2 (coins from the seed): the one-run ε bound
    ONE_RUN = "one_run"


class Neighbours(Vocab):
    """The neighbour relation an ε is stated for: training sets that differ by adding or removing one row,
    or by replacing one row with another. DP-SGD accountants state add/remove; the member / non-member
    audit plays replace-one (which row of a pair is trained on); the one-run canaries play add/remove."""

    ADD_REMOVE = "add/remove"
    REPLACE_ONE = "replace-one"


class AuditKind(Vocab):
    """What ``iclmem audit-context --attack`` asks of a deployed in-context learner; each kind's settings and
    runner are registered once, in orchestrator/audits/audit_kinds.py."""

    MEMBERSHIP = "membership"  # was the row in the context
    LABEL = "label"  # does the model give away a context row's label
    ATTRIBUTE = "attribute"  # ... a context row's sensitive column
    FILE = "file"  # what the package's saved file gives back of its context


# the audit kinds that infer a value of a context row: ``--attack label|attribute`` and a sweep's
# ``probe.value_inference`` (its Literal is tied to these by tests/test_audit_kinds.py)
VALUE_ATTACKS: tuple[str, ...] = (AuditKind.LABEL.value, AuditKind.ATTRIBUTE.value)


class InferenceAttack(Vocab):
    """The value-inference attacks against a deployed context (probes/attacks/value_inference.py)."""

    LABEL = "label"  # argmax of p(class | x, context): is it the row's label?
    ATTRIBUTE_MODEL = "attribute_model"  # the candidate of the sensitive column maximising log p(y* | x_v, context)
    ATTRIBUTE_CALIBRATED = "attribute_calibrated"  # ... minus its mean under the references without the row


class InferenceGroup(Vocab):
    """Which rows a value-inference statistic is over (probes/attacks/value_inference.py)."""

    MEMBERS = "members"
    NONMEMBERS = "nonmembers"
    DIFFERENCE = "members_minus_nonmembers"  # the members' statistic minus the non-members'


class Channel(Vocab):
    """Through which channel a row's membership leaks (the data owner's risk report, orchestrator/report/record_risk.py):
    the weights fine-tuned on it (the probe, the known-context prediction, LiRA / RMIA on either), or the
    context of a deployed in-context learner it was placed in (``regime: context``'s audits)."""

    FINE_TUNED_WEIGHTS = "fine_tuned_weights"
    DEPLOYED_CONTEXT = "deployed_context"


class SliceFamily(Vocab):
    """How the risk report groups a task's rows (``report.slices.by``; orchestrator/schema/slices.py)."""

    CLASS = "class"  # the row's true label (a regression target's bin)
    OUTLIER = "outlier"  # quantile bin of the mean distance to the row's nearest rows in the encoded space
    NEAR_DUPLICATES = "near_duplicates"  # whether another row lies within a small radius of it
    RARE_CATEGORIES = "rare_categories"  # per categorical column: the row holds a level few rows share
    COLUMN = "column"  # a column the user names (``report.slices.columns``): its levels or quartiles


class KeepCheckpoints(Vocab):
    """Which checkpoint files a sweep keeps once every probe of a checkpoint is stored (``training.keep_checkpoints``;
    orchestrator/driver/checkpoint_keeping.py). A running trial's latest checkpoint always keeps everything: Tune resumes
    the trial from it. A checkpoint folder is never removed: its manifest and ground-truth log stay, so a removed
    file is named for what it was, and recomputed weights are checked against the digest the manifest recorded."""

    ALL = "all"  # every checkpoint keeps its weights and its resume state (optimizer, RNG): training can go on from any epoch
    WEIGHTS = "weights"  # every checkpoint keeps its weights; the resume state only while it is a running trial's latest
    LAST = "last"  # each run's last checkpoint keeps its weights; earlier ones lose theirs once probed
    NONE = "none"  # no weights once probed; a finished run keeps manifests only (weights recomputable from the config)


class WandbMode(Vocab):
    OFFLINE = "offline"
    ONLINE = "online"
    DISABLED = "disabled"


def values(enum: type[Enum]) -> tuple[str, ...]:
    """The plain string values of a vocabulary, in declaration order (for report columns and messages)."""
    return tuple(str(member.value) for member in enum)


class ClaimKind(Vocab):
    """What a statement of the report, the console or the W&B summary claims about leakage: one kind per line
    of the claim ledger (orchestrator/report/claim_ledger.py), each with its own selection, family and null path."""

    RUN_VERDICT = "run_verdict"  # a run's headline checkpoint is memorization
    KNOWN_CONTEXT_FLAG = "known_context_flag"  # some checkpoint of a run passes the rule on the known context C'
    DEPLOYED_KNOWN_CONTEXT_FLAG = "deployed_known_context_flag"  # the same through the package's deployed classifier
    # a reference attack (LiRA online / offline, RMIA) of one channel calls a run memorization at its headline
    REFERENCE_ATTACK = "reference_attack"
    RUNS_LEAKED = "runs_leaked"  # per task: runs with a verdict or a flag (their union, one family)
    ROWS_AT_RISK = "rows_at_risk"  # per task: member rows whose risk reaches the bar, beyond what null rows reach
    SLICE_EXPOSED = "slice_exposed"  # a slice's members score higher than its non-members
    SLICE_LEAKS_MORE = "slice_leaks_more"  # a slice leaks more than the rest of the run's rows
    VALUE_SLICE_EXPOSED = "value_slice_exposed"  # a slice's values are given away (label / attribute inference)
    TASK_VERDICT = "task_verdict"  # Tab. 8's controlled task-level verdict


class RoundingCheck(Vocab):
    """Whether a claim holds again on outputs rounded as a deployed model rounds them (``probe.output_decimals``)."""

    SURVIVES = "survives"  # made again on rounded outputs
    LOST = "lost"  # made on exact outputs only
    NOT_TESTED = "not_tested"  # no rounded re-test of this kind of claim (or of this folder)


class ClaimReading(Vocab):
    """How the first screen reads a claim, from its ledger line (orchestrator/report/claim_ledger.py ``reading``)."""

    LEAK = "leak"  # made, its false-positive rate measured at or under the level, and it survives rounding
    EXACT_OUTPUTS_ONLY = "exact_outputs_only"  # made, but gone on rounded outputs
    # made, but its null rate rests on too few null trials to resolve the level (fewer than the ledger's minimum)
    TOO_FEW_NULL_TRIALS = "too_few_null_trials"
    WITHIN_CHANCE = "within_chance"  # made, but the null data through the same path make it as often as the level
    UNMEASURED = "unmeasured"  # made, with no false-positive rate measured: not a claim the first screen makes
    NOT_MADE = "not_made"  # tested and not made
