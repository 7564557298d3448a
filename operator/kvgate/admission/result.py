"""What an admission check decides: allowed or not, and every problem with its field."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    """One denial or warning: the field path (``spec.decode.memFractionStatic``) and a message
    with the numbers and the way out."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


@dataclass(frozen=True)
class AdmissionResult:
    """The decision on one ModelDeployment. Allowed exactly when there is no denial."""

    denials: tuple[Problem, ...] = ()
    warnings: tuple[Problem, ...] = field(default=())

    @property
    def allowed(self) -> bool:
        return not self.denials

    @property
    def message(self) -> str:
        """Every denial, for the AdmissionReview status and the command line."""
        if not self.denials:
            return ""
        if len(self.denials) == 1:
            return str(self.denials[0])
        lines = "\n".join(f"- {denial}" for denial in self.denials)
        return f"{len(self.denials)} problems:\n{lines}"

    def as_dict(self) -> dict[str, object]:
        return {
            "allowed": self.allowed,
            "denials": [{"field": p.field, "message": p.message} for p in self.denials],
            "warnings": [{"field": p.field, "message": p.message} for p in self.warnings],
        }
