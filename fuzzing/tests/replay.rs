//! Replays the committed fuzzing corpus (`fuzz/corpus/<target>/`), the
//! hand-written seeds (`fuzz/seeds/<target>/`) and the regression inputs
//! (`fuzz/regressions/<target>/`, crashes that were fixed)
//! through the harness functions the cargo-fuzz targets call, on stable, on
//! every `cargo test`. `fuzz/artifacts-found/` (open findings) is not
//! replayed.
#![allow(clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// Held by every test: the `vhost` harness checks that the process's
/// descriptor count comes back after each input, which the other harnesses
/// opening descriptors at the same time break (guest RAM files of `ctrl`
/// and `wqe` inputs; the daemon and VMMs the engine harness opens and
/// keeps).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut files = Vec::new();
    for dir in ["corpus", "seeds", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for e in entries {
            let path = e.expect("read a corpus directory entry").path();
            if path.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn replay(target: &str, run: fn(&[u8]), min_files: usize) {
    let files = inputs(target);
    assert!(
        files.len() >= min_files,
        "{target}: {} corpus files, expected at least {min_files}",
        files.len()
    );
    let start = Instant::now();
    for f in &files {
        let data = std::fs::read(f).expect("read a corpus file");
        eprintln!("{target}: {}", f.display());
        run(&data);
    }
    eprintln!(
        "{target}: {} inputs replayed in {:.2?}",
        files.len(),
        start.elapsed()
    );
}

#[test]
fn replay_ctrl() {
    let _serial = serial();
    replay("ctrl", vhost_user_rdma_fuzz::ctrl::run, 1);
}

#[test]
fn replay_wqe() {
    let _serial = serial();
    replay("wqe", vhost_user_rdma_fuzz::wqe::run, 1);
}

#[test]
fn replay_engine() {
    let _serial = serial();
    replay("engine", vhost_user_rdma_fuzz::engine::run, 1);
    vhost_user_rdma_fuzz::engine::release();
}

/// Pseudo-random inputs (a fixed seed), so that the harnesses themselves
/// are exercised even before a corpus exists.
#[test]
fn random_inputs_pass() {
    let _serial = serial();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in 0..300 {
        let len = 64 + (i * 37) % 2000;
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        vhost_user_rdma_fuzz::ctrl::run(&data);
        vhost_user_rdma_fuzz::wqe::run(&data);
    }
}

/// A hand-written `wqe` input reaches the parsers and the resolution.
#[test]
fn wqe_structured_input_gets_deep() {
    let _serial = serial();
    use vhost_user_rdma_fuzz::guest::Addr;
    use vhost_user_rdma_fuzz::wqe::*;
    let _ = Addr::Aligned(0);
    let input = Input {
        mrs: vec![
            MrIn {
                pd2: false,
                access: 0xf,
                iova: 0x10_0000,
                length: 12000,
                first_page_offset: 100,
                pages: vec![10, 11, 70, 12],
            },
            MrIn {
                pd2: false,
                access: 0x6,
                iova: 0x7000_0000,
                length: 4096,
                first_page_offset: 0,
                pages: vec![100],
            },
        ],
        qp: QpIn {
            pd2: false,
            sq_log: 3,
            rq_log: 3,
            send_sge: 3,
            recv_sge: 2,
            inline: 32,
            srq: false,
            pages: vec![30, 31, 32],
        },
        slots: vec![
            SlotIn {
                queue: Queue::Send,
                index: 2,
                body: Body::Wqe {
                    opcode: 2,
                    flags: 1,
                    sges: vec![
                        SgeIn {
                            mr: Ok(0),
                            off: 4000,
                            len: 500,
                        },
                        SgeIn {
                            mr: Ok(1),
                            off: 0,
                            len: 100,
                        },
                    ],
                    inline: Vec::new(),
                    count_delta: 0,
                    reserved: false,
                },
                part: (300, 250),
                write: false,
            },
            SlotIn {
                queue: Queue::Recv,
                index: 9,
                body: Body::Wqe {
                    opcode: 0,
                    flags: 0,
                    sges: vec![SgeIn {
                        mr: Ok(0),
                        off: 8000,
                        len: 3000,
                    }],
                    inline: Vec::new(),
                    count_delta: 0,
                    reserved: false,
                },
                part: (0, u32::MAX),
                write: true,
            },
        ],
        remote: vec![RemoteIn {
            mr: Ok(0),
            off: 4090,
            len: 20,
        }],
        fast: vec![
            FastIn {
                pd2: false,
                access: 0x1,
                iova: 0x9000_0800,
                length: 9000,
                shift: 1,
                pages: vec![40, 42],
                register: true,
            },
            FastIn {
                pd2: false,
                access: 0xf,
                iova: 0,
                length: 1,
                shift: 0,
                pages: vec![1],
                register: false,
            },
        ],
    };
    let mut input = input;
    // Through a registered fast region's key (0xe0), a free one's (0xe1),
    // and the local DMA key (0xf0: page 0xf0 + 1, offset 0x10).
    let sge = |mr, off, len| SgeIn { mr, off, len };
    input.slots.push(SlotIn {
        queue: Queue::Send,
        index: 3,
        body: Body::Wqe {
            opcode: 0,
            flags: 1,
            sges: vec![sge(Ok(0xe0), 100, 5000), sge(Ok(0xf0), 0x1010, 200)],
            inline: Vec::new(),
            count_delta: 0,
            reserved: false,
        },
        part: (50, 6000),
        write: true,
    });
    input.slots.push(SlotIn {
        queue: Queue::Send,
        index: 4,
        body: Body::Wqe {
            opcode: 0,
            flags: 1,
            sges: vec![sge(Ok(0xe1), 0, 1)],
            inline: Vec::new(),
            count_delta: 0,
            reserved: false,
        },
        part: (0, 1),
        write: false,
    });
    assert_eq!(run_input(&input), 4, "every WQE parsed and resolved");
}

/// The QP-number-reuse scenario of the `engine` target: VM 0's QP sends to
/// VM 1's QP, which is destroyed and re-created with the same QP number
/// (the harness's allocator reuses numbers at once), and VM 0 sends again.
/// It hung the engine for good (a self-deadlock the fuzzer found; the
/// inputs are in fuzz/regressions/engine/).
#[test]
fn engine_qpn_reuse_scenario() {
    let _serial = serial();
    use vhost_user_rdma_fuzz::engine::*;
    let send = |kind| Op::PostSend {
        vm: 0,
        qp: 0,
        kind,
        off: 0,
        len: 16,
        roff: 0,
        lkey: Key::Good,
        rkey: Key::Good,
        count: 0,
    };
    let recv = Op::PostRecv {
        vm: 1,
        qp: 0,
        off: 0,
        len: 64,
        key: Key::Good,
    };
    let input = Input {
        three: false,
        ops: vec![
            Op::CreateQp(0),
            Op::CreateQp(1),
            Op::Connect(0, 0, 1, 0),
            recv.clone(),
            send(0),
            Op::Sleep(5),
            Op::Poll(0),
            Op::DestroyQp(1, 0),
            Op::CreateQp(1),
            send(2),
            Op::Sleep(5),
            Op::Poll(0),
        ],
    };
    run_input(&input);
    release();
}

/// [`engine_qpn_reuse_scenario`] with the harness's macro operations, the
/// shortest form the fuzzer finds: a connected pair, a WRITE, the peer QP
/// re-created (same QP number), another WRITE.
#[test]
fn engine_qpn_reuse_scenario_short() {
    let _serial = serial();
    use vhost_user_rdma_fuzz::engine::*;
    let write = Op::PostSend {
        vm: 0,
        qp: 0,
        kind: 2,
        off: 0,
        len: 16,
        roff: 0,
        lkey: Key::Good,
        rkey: Key::Good,
        count: 0,
    };
    let input = Input {
        three: false,
        ops: vec![
            Op::Pair(0, 1),
            write.clone(),
            Op::Sleep(5),
            Op::Recreate(1, 0),
            write,
            Op::Sleep(5),
        ],
    };
    run_input(&input);
    release();
}

/// Fast registration in the `engine` target's operations: VM 1 registers
/// its buffer on a QP connected to VM 0's, VM 0 writes and reads through
/// the new key, sends with the local DMA key, VM 1 invalidates, VM 0
/// writes through the key again (refused: both QPs fail), a new pair, a
/// registration refused, and a SEND_WITH_INV of the key. The harness's
/// invariants hold throughout (the daemon answers, everything is released
/// at the end).
#[test]
fn engine_fast_registration_scenario() {
    let _serial = serial();
    use vhost_user_rdma_fuzz::engine::*;
    let through = |kind, local, remote| Op::Through {
        vm: 0,
        qp: 0,
        kind,
        off: 64,
        len: 2000,
        roff: 128,
        local,
        remote,
    };
    let input = Input {
        three: false,
        ops: vec![
            Op::Pair(0, 1),
            Op::FastReg {
                vm: 1,
                qp: 0,
                how: 0,
                off: 0,
                len: u16::MAX,
            },
            Op::Sleep(5),
            through(2, Via::Mr, Via::Fast),
            through(4, Via::Dma, Via::Fast),
            through(0, Via::Dma, Via::Mr),
            Op::PostRecv {
                vm: 1,
                qp: 0,
                off: 0,
                len: 4096,
                key: Key::Good,
            },
            Op::Sleep(5),
            Op::LocalInv {
                vm: 1,
                qp: 0,
                key: Key::Good,
            },
            Op::Sleep(5),
            through(2, Via::Mr, Via::Fast),
            Op::Sleep(5),
            Op::Poll(0),
            Op::Poll(1),
            Op::Pair(0, 1),
            Op::FastReg {
                vm: 1,
                qp: 1,
                how: 4,
                off: 0,
                len: 100,
            },
            Op::Pair(0, 1),
            Op::FastReg {
                vm: 1,
                qp: 2,
                how: 1,
                off: 100,
                len: 5000,
            },
            Op::PostRecv {
                vm: 1,
                qp: 2,
                off: 0,
                len: 64,
                key: Key::Good,
            },
            Op::SendInv {
                vm: 0,
                qp: 2,
                key: Key::Good,
                off: 0,
                len: 32,
            },
            through(2, Via::Hole, Via::Dma),
            Op::Sleep(5),
            Op::Poll(0),
            Op::Poll(1),
        ],
    };
    run_input(&input);
    release();
}

#[test]
fn replay_state() {
    let _serial = serial();
    replay("state", vhost_user_rdma_fuzz::state::run, 1);
    vhost_user_rdma_fuzz::state::release();
}

/// The seeds of the `state` target are states a daemon saved, and load:
/// written into `fuzz/seeds/state/` with `VIRTIO_RDMA_WRITE_SEEDS=1`,
/// checked against what is there otherwise.
#[test]
fn state_seeds_are_saved_states_and_load() {
    let _serial = serial();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/state");
    let bodies = vhost_user_rdma_fuzz::state::seed_bodies();
    if std::env::var_os("VIRTIO_RDMA_WRITE_SEEDS").is_some() {
        std::fs::create_dir_all(&dir).expect("create the seed directory");
        for (i, b) in bodies.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-saved-{i}")), b).expect("write a seed");
        }
    }
    for b in &bodies {
        assert!(
            vhost_user_rdma_fuzz::state::run_loaded(b),
            "a state a daemon saved does not load"
        );
    }
    vhost_user_rdma_fuzz::state::release();
}

#[test]
fn replay_vhost() {
    let _serial = serial();
    replay("vhost", vhost_user_rdma_fuzz::vhost::run, 1);
}

/// The `vhost` harness on a structured input: a full set-up over a sealed
/// file, odd tables (past the file, unsealed), junk rings and kicks, and
/// `GET_CONFIG` in and out of bounds; the harness checks that the daemon
/// releases everything and VM 1 is unaffected.
#[test]
fn vhost_structured_input() {
    let _serial = serial();
    use vhost_user_rdma_fuzz::vhost::{run_input, Input, Op, Region};
    let region = |file, pages| Region {
        file,
        gpa_page: 0,
        pages,
        offset_page: 0,
        offset_bytes: 0,
        odd_va: None,
    };
    let mut ops = vec![Op::Handshake, Op::MemTable(vec![region(0, 256)])];
    for index in 0..3 {
        let base = u32::from(index) * 0x4000;
        ops.extend([
            Op::VringNum { index, num: 64 },
            Op::VringBase { index, base: 0 },
            Op::VringAddr {
                index,
                desc: base,
                avail: base + 0x1000,
                used: base + 0x2000,
                flags: 0,
            },
            Op::VringCall {
                index,
                no_fd: false,
            },
            Op::VringKick {
                index,
                no_fd: false,
            },
            Op::VringEnable { index, on: true },
        ]);
    }
    ops.extend([
        Op::WriteRam {
            file: 0,
            offset: 0x1000,
            data: vec![0, 0, 5, 0, 1, 0, 2, 0],
        },
        Op::Kick { index: 0 },
        Op::GetConfig {
            offset: 0,
            size: 96,
            flags: 0,
        },
        Op::GetConfig {
            offset: 90,
            size: 16,
            flags: 0,
        },
        Op::Truncate { file: 0, len: 0 },
        Op::GetVringBase { index: 0 },
        Op::ResetDevice,
        Op::MemTable(vec![region(1, 4096)]),
        Op::Handshake,
        Op::MemTable(vec![region(2, 16)]),
        Op::Handshake,
        Op::GetConfig {
            offset: 4095,
            size: 96,
            flags: 0,
        },
    ]);
    run_input(&Input { ops });
}
