"""Two-party computation over Z_2^64: fixed point, shares, dealer, transport, protocols.

Two non-colluding servers (parties 0 and 1) hold additive shares of every secret. Each runs the
*same* protocol code on its own ``Party`` (party id, transport, dealer, fixed-point parameters,
counters); secrets are ``SharedTensor``s, and ``reveal()`` is the only way to open one.

Run both parties in one process (two threads over an in-process transport)::

    import numpy as np
    from fedunlearn.mpc import run_two_party, sec_share, sec_ge, sec_max

    gradients = np.array([[0.5, -1.0], [0.25, 2.0]])     # held by party 0

    def program(party):
        g = sec_share(party, gradients if party.party_id == 0 else None, owner=0)
        norms_sq = (g * g).sum(axis=1)                 # Beaver products, local sum
        bigger = sec_ge(norms_sq[0], norms_sq[1])      # 0/1 share, integer scale
        best = sec_max([norms_sq])[0]                  # tournament SecMax
        return bigger.reveal(), best.reveal(), party.counters.snapshot()

    (bit, best, costs), _ = run_two_party(program, dealer_seed=7)

Shares that already exist (e.g. a client's upload split with ``split_shares``) are wrapped with
``party.tensor(share_array)``. For two OS processes on a trusted loopback (tests), each builds
its own ``Party`` on a TCP transport and calls the same program (no authentication: the
listener takes the first connection)::

    # party 0                                     # party 1
    listener = TcpListener("127.0.0.1", 0)        transport = TcpTransport.connect(host, port)
    transport = listener.accept()                 party = Party(1, transport, dealer_seed=7)
    party = Party(0, transport, dealer_seed=7)    program(party)
    program(party)

Both parties must use the same ``dealer_seed`` and ``FixedPoint`` and call protocols in the same
order. A ``dealer_seed`` selects the *simulated* ``Dealer`` (tests, sweeps): each party computes
the dealer's side itself, so both sit in one trust domain and it is not secure.

A deployment runs four roles (``identity.ROLES``: dealer, server0, server1, clients), each
with a certificate of one CA that binds its role (``create_trial_pki`` makes a trial set), and
binds every link to one session (``SessionBinding``: session id and named digests of the job).
The dealer is a third process that alone holds the master secret and sends party 0 only
16-byte seeds and party 1 its seed plus one correction share per request::

    ids = create_trial_pki("pki")                 # or Identity.load(ca, cert, key) per process
    binding = SessionBinding("run-42", {"run_config": digest(config_text)})
    dealer = start_dealer_process(Security(identity=ids["dealer"]))   # process 3
    # server k in {0, 1}, each in its own process:
    mine = Security(identity=ids[f"server{k}"])
    remote = RemoteDealer.connect(*dealer.address, party_id=k, security=mine, binding=binding)
    if k == 0:                                    # server 0 listens, server 1 connects
        link = accept_peer(TcpListener(host, port), role="server0", peer_role="server1",
                           security=mine, binding=binding)
    else:
        link = connect_peer((host, port), role="server1", peer_roles={"server0"},
                            security=mine, binding=binding)
    party = Party(k, link.transport, dealer=remote)
    remote.plan(requests)                         # optional: stream the material ahead
    program(party)
    party.close()                                 # says goodbye; the dealer exits after both do

Each service keeps accepting until the authenticated peers of its roles arrive and survives
junk connections; a peer of another role, a second claim of a role, or a hello of another
session is refused (``SessionMismatchError`` names the differing fields). Plain TCP needs an
explicit ``Security.plain()``; there is no default. The dealer pairs the two parties'
requests by sequence number; mismatching requests raise ``SecureComputationError`` at both,
and a dealer that dies raises ``PeerDisconnectedError``.

``Party(..., comparison="ideal")`` makes every comparison (and so SecMax, SecSrt) use the fast
ideal functionality while charging the real protocol's bytes and rounds (cost sweeps; not
secure; refused on any transport but the in-process one). ``party.counters`` holds bytes,
rounds and messages, offline (dealer material) and online.

Paper functionality -> function (all take ``SharedTensor``s; the party comes with them):

    SecShare  sec_share(party, values | None, owner)    SecRec   x.reveal() / sec_reveal(x)
    SecAdd    x + y, x + public (local)                 public   x * c, x @ A, A @ x (local)
    SecMul    sec_mul(x, y) or x * y (sec_mul_many: several products in one round)
    SecMul    matrix: sec_matmul(x, y) or x @ y         SecSP    sec_inner(x, y) (last axis)
    SecMul3   sec_mul3(x, y, z)                         square   sec_square(x)
    SecSel    sec_select(bit, if_true, if_false)        ZeroGen  sec_constant(party, c)
    SecGE     sec_ge(x, y) -> bit                       SecGE2   sec_ge2(u_i, v_i, u_j, v_j)
    SecGE3    sec_ge3(w_i, b_i, w_j, b_j)               SecGE4   sec_ge4(w_i, a_i, v_i, ...)
    SecMax    sec_max([key, *payload], comparator)      SecSrt   sec_sort([key, *payload], ...)
    SecDiv    sec_div(u, v, v_range)                    SecMI    sec_inverse(x)
    sqrt      sec_sqrt(x, x_range)                      SecRanGen party.dealer.random(shape)
    secure aggregation: sec_aggregate([...]) (sum of shares, local)
    public constant: sec_constant(party, c) (re-randomised)   range guard: sec_check_range
    check an opened value: check_opened(values, fixed_point, max_norm=...)

A comparator for ``sec_max``/``sec_sort`` ranks two batches of entries, e.g. Method 1's ratio
u / v: ``lambda a, b: sec_ge2(a[0], a[1], b[0], b[1])``. ``sec_ge`` computes only the carry
into bit 63 (a bit-packed tree: 8 rounds, 39.5 bytes + 1 bit per comparison and party in large
batches, 152 bytes for a single one); ``ge_cost(n, party_id)`` gives the exact traffic of ``n``
comparisons in one call, and ``comparison="ideal"`` charges exactly that.

Scales: reals carry f fractional bits (``FixedPoint``, default 13); comparison bits and
integers carry 0, so bit * value is exact. Multiplying two reals truncates locally (<= 1 LSB;
see ``fixed_point``). Public operands (``x * 0.5``, ``x @ matrix``) are local. Keep values
below 2^(62 - f) in magnitude (2^49 at f = 13) and products below 2^(62 - 2f) before they are
truncated; ``sec_ge2``/``sec_ge4`` compare untruncated products, which must stay below that.

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Sec. III-IV, App. B (Tables IV-VI), Alg. 5, 7. Where the protocols depart from the paper:
MPC1-MPC10 in docs/mpc.md. Threat model and what each party learns: docs/security.md.
"""

from fedunlearn.mpc import protocols
from fedunlearn.mpc.dealer import Dealer, DealerClient
from fedunlearn.mpc.dealer_process import DealerProcess, start_dealer_process
from fedunlearn.mpc.dealer_service import DealerOptions, DealerServer
from fedunlearn.mpc.fixed_point import FixedPoint, check_opened, split_shares, truncate_share
from fedunlearn.mpc.identity import ROLES, Identity, create_trial_pki
from fedunlearn.mpc.link import Link, accept_peer, accept_peers, connect_peer
from fedunlearn.mpc.party import Party, run_two_party
from fedunlearn.mpc.prg import Prg, expand_seed
from fedunlearn.mpc.protocols import *  # noqa: F403 (the protocols' __all__, re-exported whole)
from fedunlearn.mpc.remote_dealer import RemoteDealer
from fedunlearn.mpc.security import LinkLimits, Security
from fedunlearn.mpc.session import SessionBinding, digest
from fedunlearn.mpc.shares import SharedTensor, concatenate, stack
from fedunlearn.mpc.tcp import TcpListener, TcpTransport
from fedunlearn.mpc.transport import Counters, InProcessTransport, Traffic, Transport

__all__ = [
    "Counters",
    "Dealer",
    "DealerClient",
    "DealerOptions",
    "DealerProcess",
    "DealerServer",
    "FixedPoint",
    "Identity",
    "InProcessTransport",
    "Link",
    "LinkLimits",
    "Party",
    "Prg",
    "ROLES",
    "RemoteDealer",
    "Security",
    "SessionBinding",
    "SharedTensor",
    "TcpListener",
    "TcpTransport",
    "Traffic",
    "Transport",
    "accept_peer",
    "accept_peers",
    "check_opened",
    "concatenate",
    "connect_peer",
    "create_trial_pki",
    "digest",
    "expand_seed",
    "run_two_party",
    "split_shares",
    "stack",
    "start_dealer_process",
    "truncate_share",
]
__all__ += protocols.__all__
