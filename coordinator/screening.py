"""Which peers' records the coordinator plans with, and why it leaves the others out: the admission rule
(coordinator/admission.py), the claims their measured compute contradicts (coordinator/claims.py) and the
advertised checkpoints the ledger does (coordinator/checkpoint_ledger.py). The reasons go to the coordinator's
Refusals record (coordinator/notices.py)."""
from __future__ import annotations

from hetswarm.coordinator.admission import Admission
from hetswarm.coordinator.checkpoint_ledger import CheckpointLedger
from hetswarm.coordinator.claims import ClaimCheck
from hetswarm.protocol.records import PeerRecord

__all__ = ["Screening"]


class Screening:
    """The screen of one coordinator run; its verdicts are those of the last read."""

    def __init__(self, admission: Admission, ledger: CheckpointLedger, *, n_layers: int) -> None:
        self.admission, self.ledger, self.n_layers = admission, ledger, n_layers
        self.claims = ClaimCheck()
        self.refused: dict[str, str] = {}
        """Peers the admission rule refused, with the reason."""
        self.flagged: dict[str, str] = {}
        """Peers whose claims their measured compute contradicts, or whose advertised checkpoints the ledger does,
        with the reason."""

    def screen(self, records: dict[str, PeerRecord]) -> tuple[dict[str, PeerRecord], bool]:
        """The records to plan with, and whether the ledger learned of a checkpoint (the state file keeps them)."""
        records, self.refused = self.admission.screen(records)
        records, self.flagged = self.claims.judge(records)
        learned = self.ledger.observe(records)
        self.flagged |= self.ledger.contradicted(records, self.n_layers)
        return records, learned
