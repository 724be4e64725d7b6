"""SCRAM-SHA-256 (raftmq.scram) against RFC 7677's example exchange, and the broker's
checks of a proof, without a broker."""

from __future__ import annotations

import base64

import pytest

from raftmq import scram

# RFC 7677, section 3: user "user", password "pencil".
CLIENT_FIRST = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_FIRST = (
    "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
CLIENT_FINAL = (
    "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_the_client_side_reproduces_rfc_7677() -> None:
    message, bare = scram.client_first("user", "rOprNGfwEbeRWgbNEkqO")
    assert message == CLIENT_FIRST
    nonce, salt, iterations = scram.parse_server_first(SERVER_FIRST, "rOprNGfwEbeRWgbNEkqO")
    final, expected = scram.client_final("pencil", bare, SERVER_FIRST, nonce, salt, iterations)
    assert final == CLIENT_FINAL
    scram.check_server_final(SERVER_FINAL, expected)


def test_the_server_side_checks_the_rfc_7677_proof_from_the_stored_keys_alone() -> None:
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    stored = scram.credential("pencil", salt=salt, iterations=4096)
    user, client_nonce, bare = scram.parse_client_first(CLIENT_FIRST)
    assert (user, client_nonce) == ("user", "rOprNGfwEbeRWgbNEkqO")
    nonce, final_bare, proof = scram.parse_client_final(CLIENT_FINAL)
    assert nonce.startswith(client_nonce)
    signature = scram.verify_proof(stored, bare, SERVER_FIRST, final_bare, proof)
    assert signature is not None and scram.server_final(signature) == SERVER_FINAL
    wrong = scram.credential("pencil2", salt=salt, iterations=4096)
    assert scram.verify_proof(wrong, bare, SERVER_FIRST, final_bare, proof) is None


def test_names_with_commas_and_equals_are_escaped() -> None:
    message, _ = scram.client_first("a,b=c", "n0nce")
    assert message == "n,,n=a=2Cb=3Dc,r=n0nce"
    assert scram.parse_client_first(message)[0] == "a,b=c"


@pytest.mark.parametrize(
    "bad",
    ["y,,n=user,r=x", "n,,n=user", "n,,garbage", "n,,n=a=b,r=x"],
)
def test_malformed_client_first_messages_are_refused(bad: str) -> None:
    with pytest.raises(scram.ScramError):
        scram.parse_client_first(bad)


def test_a_server_that_does_not_extend_the_nonce_or_asks_too_few_iterations_is_refused() -> None:
    with pytest.raises(scram.ScramError, match="extend"):
        scram.parse_server_first("r=other,s=AAAA,i=4096", "mine")
    with pytest.raises(scram.ScramError, match="4096"):
        scram.parse_server_first("r=mine+,s=AAAA,i=100", "mine")
