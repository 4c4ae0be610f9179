"""The model roles as one table, read by model building, weight loading and HF conversion.

>>> ROLES["critic"].head, ROLES["critic"].trainable, ROLES["critic"].fresh_head
('scalar', True, True)
>>> list(ROLES)
['actor', 'ref', 'critic', 'reward']
"""
from __future__ import annotations

from dataclasses import dataclass

HEAD_KEY = "output_layer."  # the head's parameters (LM head [V, h] or value/score head [1, h])


@dataclass(frozen=True, slots=True)
class RoleSpec:
    head: str  # "lm": next-token logits over the vocabulary; "scalar": one value per position
    trainable: bool  # an optimizer updates it (else frozen: no grad, eval mode)
    from_actor: bool  # without its own checkpoint it starts from the actor's weights
    fresh_head: bool = False  # may start from weights without its head (an LM): the head keeps its init

    @property
    def lm_head(self) -> bool:
        return self.head == "lm"

    @property
    def skip_from_actor(self) -> tuple[str, ...]:
        """Key prefixes not copied from the actor (a head of another kind)."""
        return (HEAD_KEY,) if self.fresh_head else ()


ROLES: dict[str, RoleSpec] = {
    "actor": RoleSpec(head="lm", trainable=True, from_actor=False),
    "ref": RoleSpec(head="lm", trainable=False, from_actor=True),
    "critic": RoleSpec(head="scalar", trainable=True, from_actor=True, fresh_head=True),
    "reward": RoleSpec(head="scalar", trainable=False, from_actor=False),
}


def role_spec(role: str) -> RoleSpec:
    if role not in ROLES:
        raise ValueError(f"unknown model role '{role}'. Available: {', '.join(ROLES)}.")
    return ROLES[role]
