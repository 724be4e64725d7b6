from raftmq.api import codegen


def test_committed_generated_code_matches_the_proto_files():
    stale = codegen.is_current()
    assert not stale, f"regenerate with 'make proto': {stale}"
