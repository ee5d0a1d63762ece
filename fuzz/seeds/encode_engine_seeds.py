# Writes the hand-written seeds of the engine target (fuzz/seeds/engine/):
# the arbitrary encoding of `vhost_user_rdma_fuzz::engine::Input` (enum variant
# = u32 scaled by the variant count, integers little-endian, a bool byte
# before each element of the operation list). Usage: python3 THIS OUTDIR
# Check a file with: cargo +nightly fuzz fmt -s none engine FILE
import struct, sys, os
def var(k, n):
    v = -(-(k << 32) // n)  # ceil
    assert (v * n) >> 32 == k
    return struct.pack('<I', v)
# The variants of `Op` in their order (a new variant changes every encoding: run this again).
OPS = ['CreateQp','CreateUcQp','DestroyQp','Connect','ConnectTo','PostRecv','PostSend','Poll','Sleep','Reset','Disconnect','Rereg','Recreate','Pair','Gsi','GsiRecv','Mad','FastReg','LocalInv','SendInv','Through','BindMw','ResizeCq','ReregMr']
N = len(OPS)
def op(name, *f): return var(OPS.index(name), N) + b''.join(f)
u8 = lambda x: bytes([x]); u16 = lambda x: struct.pack('<H', x)
good = var(0, 3)
def send(vm, qp, kind, off=0, ln=64, roff=0, count=0):
    return op('PostSend', u8(vm), u8(qp), u8(kind), u16(off), u16(ln), u16(roff), good, good, u8(count))
def recv(vm, qp, off=0, ln=256):
    return op('PostRecv', u8(vm), u8(qp), u16(off), u16(ln), good)
def gsi_recv(vm, off=0, ln=296):
    return op('GsiRecv', u8(vm), u16(off), u16(ln))
def mad(vm, to, qpn=0, sgid=0, ln=256, off=0, imm=0, count=0):
    return op('Mad', u8(vm), u8(to), u8(qpn), u8(sgid), u16(ln), u16(off), u8(imm), u8(count))
def bind(vm, qp, how=0, type2=0, off=0, ln=4096):
    return op('BindMw', u8(vm), u8(qp), u8(how), u8(type2), u16(off), u16(ln))
seeds = {
 'pair-traffic': [op('Pair', u8(0), u8(1)), recv(1,0), send(0,0,0), send(0,0,2), send(0,0,4), send(0,0,5), send(0,0,6), op('Sleep', u8(5)), op('Poll', u8(0)), op('Poll', u8(1))],
 'pair-recreate': [op('Pair', u8(0), u8(1)), send(0,0,2), op('Sleep', u8(5)), op('Recreate', u8(1), u8(0))],
 'reset-mid-traffic': [op('Pair', u8(0), u8(1)), recv(1,0), send(0,0,0, count=3), op('Reset', u8(1)), op('Poll', u8(0))],
 'disconnect-mid-traffic': [op('Pair', u8(0), u8(1)), send(0,0,2, ln=4000, count=3), op('Disconnect', u8(0)), op('Poll', u8(1))],
 'destroy-mid-traffic': [op('Pair', u8(0), u8(1)), send(0,0,4, ln=4000, count=3), op('DestroyQp', u8(0), u8(0)), op('Poll', u8(0))],
 'gsi-mads': [op('Gsi', u8(0)), op('Gsi', u8(1)), gsi_recv(1), gsi_recv(1, 512), gsi_recv(0), mad(0, 1), mad(0, 1, ln=300), mad(1, 0, qpn=0xf2), mad(1, 0, sgid=0xf0, imm=1), mad(0, 0, count=3), op('Sleep', u8(5)), op('Poll', u8(0)), op('Poll', u8(1))],
 'resize-mid-traffic': [op('Pair', u8(0), u8(1)), recv(1,0), send(0,0,0, count=3), send(0,0,2, count=3), op('ResizeCq', u8(0), u8(0)), op('ResizeCq', u8(1), u8(5)), send(0,0,4, count=2), op('Sleep', u8(3)), op('ResizeCq', u8(0), u8(3)), op('Poll', u8(0)), op('Poll', u8(1))],
 'rereg-mid-traffic': [op('Pair', u8(0), u8(1)), send(0,0,2, ln=4000, count=3), op('ReregMr', u8(1), u8(4), u8(1)), send(0,0,2, count=2), op('ReregMr', u8(1), u8(7), u8(0)), send(0,0,3), op('Sleep', u8(3)), op('Poll', u8(0))],
 'uc-bind-mw': [op('CreateUcQp', u8(0)), op('CreateUcQp', u8(1)), op('Connect', u8(0), u8(0), u8(1), u8(0)), recv(1,0), send(0,0,0), op('Pair', u8(0), u8(1)), bind(1, 1, type2=1), op('ReregMr', u8(1), u8(4), u8(0)), op('Sleep', u8(3)), op('Poll', u8(0)), op('Poll', u8(1))],
 'gsi-reset': [op('Gsi', u8(0)), op('Gsi', u8(1)), gsi_recv(1), mad(0, 1, count=3), op('Reset', u8(1)), op('Gsi', u8(1)), mad(0, 1), op('Disconnect', u8(0)), op('Poll', u8(1))],
}
out = sys.argv[1]
for name, ops in seeds.items():
    open(os.path.join(out, 'seed-' + name), 'wb').write(b'\x00' + b''.join(b'\x01' + o for o in ops))
