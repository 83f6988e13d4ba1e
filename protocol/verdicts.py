"""What a run said of its arrival rate, and what a live confirmation said of its twin's capacity: the closed sets of
a capacity study's verdicts. capacity.json records them as flags (a probe's `sustained` and `judged`, a
confirmation's `agrees`: true, false or null), and its texts and the report's marks spell them out; `of` reads the
flags, so files old and new read alike. A confirmation's `agreed_by` (AgreedBy) says what decided its `agrees`."""
from enum import StrEnum


class Sustain(StrEnum):
    """One run's verdict on its arrival rate (stats/verdict.py: sustain)."""

    SUSTAINED = "sustained"
    NOT_SUSTAINED = "not sustained"
    UNDECIDED = "undecided"  # it broke no rule, but could not tell: too few requests, or a queue slower to settle

    @classmethod
    def of(cls, sustained: bool, judged: bool = True) -> "Sustain":
        """From a verdict's flags (a file before `judged` was recorded: judged)."""
        if sustained:
            return cls.SUSTAINED
        return cls.NOT_SUSTAINED if judged else cls.UNDECIDED

    @property
    def mark(self) -> str:
        """✓ sustained, ✗ not, ? undecided (the report's list of rates measured)."""
        return {Sustain.SUSTAINED: "✓", Sustain.NOT_SUSTAINED: "✗", Sustain.UNDECIDED: "?"}[self]

    @property
    def agreement(self) -> "Agreement":
        """A live probe's verdict at its twin's capacity, as agreement with the twin."""
        return {Sustain.SUSTAINED: Agreement.AGREES, Sustain.NOT_SUSTAINED: Agreement.DISAGREES,
                Sustain.UNDECIDED: Agreement.UNDECIDED}[self]


class Agreement(StrEnum):
    """A live confirmation against its twin's capacity (lab/twin_confirm.py: Confirmation)."""

    AGREES = "agrees"  # the live probe sustained the twin's capacity, or ran as the twin predicts its arrivals
    DISAGREES = "disagrees"  # judged not sustained there, or outside what the twin predicts
    UNDECIDED = "undecided"  # its verdict undecided, and no prediction to hold it to

    @classmethod
    def of(cls, agrees: bool | None) -> "Agreement":
        """From capacity.json's `agrees` (null: undecided)."""
        return {True: cls.AGREES, False: cls.DISAGREES, None: cls.UNDECIDED}[agrees]

    @property
    def flag(self) -> bool | None:
        """capacity.json's `agrees`: true, false or null."""
        return {Agreement.AGREES: True, Agreement.DISAGREES: False, Agreement.UNDECIDED: None}[self]

    @property
    def mark(self) -> str:
        """✓ agrees, ⚠ disagrees, ? undecided (the report's confirmation lines)."""
        return {Agreement.AGREES: "✓", Agreement.DISAGREES: "⚠", Agreement.UNDECIDED: "?"}[self]

    @property
    def said(self) -> str:
        """'agrees', '⚠ disagrees' or 'undecided' (the study's progress note: a disagreement stands out)."""
        return f"{self.mark} {self}" if self is Agreement.DISAGREES else str(self)


class AgreedBy(StrEnum):
    """What decided a live confirmation's agreement with its twin (capacity.json's `agreed_by`; null: nothing did)."""

    VERDICT = "verdict"  # the live probe's own verdict, sustained or not, at the twin's capacity
    PREDICTION = "prediction"  # its verdict undecided: its E2E p50 against the twin's on the same arrivals
