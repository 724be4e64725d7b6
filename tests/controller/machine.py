"""A metadata state machine driven as the Raft runner drives it (increasing indexes,
bytes in and out), with typed commands and results for the tests' convenience."""

from __future__ import annotations

from raftmq.controller.commands import Command, RegisterBroker, Result, decode_result, encode
from raftmq.controller.state_machine import MetadataStateMachine


class Driver:
    def __init__(self, machine: MetadataStateMachine | None = None) -> None:
        self.machine = machine or MetadataStateMachine("test")
        self.index = self.machine.version

    def __call__(self, command: Command) -> Result:
        return self.raw(encode(command))

    def raw(self, data: bytes) -> Result:
        self.index += 1
        return decode_result(self.machine.apply(self.index, data))

    def register(self, broker_id: int, rack: str | None = None, incarnation: int = 1) -> Result:
        return self(
            RegisterBroker(
                broker_id,
                "127.0.0.1",
                9000 + broker_id,
                "127.0.0.1",
                9100 + broker_id,
                rack,
                incarnation,
                now_ms=1_000,
            )
        )
