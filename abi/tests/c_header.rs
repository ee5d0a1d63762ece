//! The C header of the ABI, `guest-driver/linux/virtio_rdma_abi.h`, is
//! generated from this crate: every wire structure and the constants the
//! guest drivers use. This test fails when the committed header differs from
//! what the crate says; `VIRTIO_RDMA_WRITE_HEADER=1 cargo test -p
//! virtio-rdma-abi --test c_header` writes it again.

use std::fmt::Write as _;
use std::path::PathBuf;

use virtio_rdma_abi::config::{self, ALL_DEVICE_FEATURES};
use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::datapath::{self, WcOpcode, WcStatus, WrOpcode};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::qp::{attr, Mtu, QpState, QpType};
use virtio_rdma_abi::{all_structs, mem, ABI_VERSION, MIN_COMPATIBLE_ABI_VERSION, VIRTIO_ID_RDMA};

fn header_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../guest-driver/linux/virtio_rdma_abi.h")
}

/// `QpDoorbell` → `qp_doorbell`.
fn snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The C declaration of a field of Rust type `ty`.
fn c_field(ty: &str, name: &str) -> String {
    match ty {
        "u8" => format!("__u8 {name}"),
        "u16" => format!("__le16 {name}"),
        "u32" => format!("__le32 {name}"),
        "u64" => format!("__le64 {name}"),
        t if t.starts_with("[u8;") => {
            let n = t.trim_start_matches("[u8;").trim_end_matches(']').trim();
            format!("__u8 {name}[{n}]")
        }
        t => format!("struct virtio_rdma_{} {name}", snake(t)),
    }
}

fn enum_block(out: &mut String, name: &str, prefix: &str, items: &[(&str, u64)]) {
    let _ = writeln!(out, "enum virtio_rdma_{name} {{");
    for (n, v) in items {
        let _ = writeln!(out, "\tVIRTIO_RDMA_{prefix}{n} = {v:#x},");
    }
    out.push_str("};\n\n");
}

fn render() -> String {
    let mut out = String::new();
    out.push_str(
        "/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */\n\
         /*\n \
         * virtio-rdma device ABI: the wire structures and constants of\n \
         * docs/virtio-rdma-spec.md. Generated from the virtio-rdma-abi crate by\n \
         * abi/tests/c_header.rs; do not edit. Used by the kernel driver and the\n \
         * rdma-core provider alike.\n \
         */\n\
         #ifndef _VIRTIO_RDMA_ABI_H\n\
         #define _VIRTIO_RDMA_ABI_H\n\n\
         #ifdef __KERNEL__\n\
         #include <linux/build_bug.h>\n\
         #else\n\
         #include <assert.h>\n\
         #endif\n\
         #include <linux/types.h>\n\n",
    );
    let _ = writeln!(out, "#define VIRTIO_RDMA_ABI_VERSION {ABI_VERSION}");
    let _ = writeln!(
        out,
        "#define VIRTIO_RDMA_MIN_COMPATIBLE_ABI_VERSION {MIN_COMPATIBLE_ABI_VERSION}"
    );
    let _ = writeln!(out, "#define VIRTIO_RDMA_DEVICE_ID {VIRTIO_ID_RDMA}\n");
    for (n, v) in [
        ("CONTROLQ", u64::from(config::CONTROLQ)),
        ("EVENTQ", u64::from(config::EVENTQ)),
        ("NOTIFYQ", u64::from(config::NOTIFYQ)),
        ("NUM_QUEUES", config::NUM_QUEUES as u64),
    ] {
        let _ = writeln!(out, "#define VIRTIO_RDMA_{n} {v}");
    }
    out.push_str("\n/* Device feature bit numbers (chapter 4). */\n");
    for (n, mask) in [
        ("F_UD", config::F_UD),
        ("F_SRQ", config::F_SRQ),
        ("F_ATOMIC", config::F_ATOMIC),
        ("F_SHMEM_DOORBELL", config::F_SHMEM_DOORBELL),
        ("F_GSI", config::F_GSI),
        ("F_MEM_MGT", config::F_MEM_MGT),
        ("F_RESIZE", config::F_RESIZE),
        ("F_MW", config::F_MW),
        ("F_UC", config::F_UC),
        ("F_XRC", config::F_XRC),
        ("F_MCAST", config::F_MCAST),
    ] {
        assert_ne!(mask & ALL_DEVICE_FEATURES, 0);
        let _ = writeln!(out, "#define VIRTIO_RDMA_{n} {}", mask.trailing_zeros());
    }
    out.push_str(
        "\n/* Sizes, doorbell constants and WQE/CQE flags (sections 11.1, 18.4, 18.7, 18.8, 18.14). */\n",
    );
    for (n, v) in [
        ("CQE_SIZE", u64::from(mem::CQE_SIZE)),
        ("SEND_WQE_HEADER", u64::from(mem::SEND_WQE_HEADER)),
        ("RECV_WQE_HEADER", u64::from(mem::RECV_WQE_HEADER)),
        ("SGE_SIZE", u64::from(mem::SGE_SIZE)),
        ("DB_RECORD_SIZE", mem::DB_RECORD_SIZE),
        ("LIST_PAGE_SIZE", mem::LIST_PAGE_SIZE),
        ("LIST_PAGE_ENTRIES", mem::LIST_PAGE_ENTRIES),
        ("MIN_PAGE_SHIFT", u64::from(mem::MIN_PAGE_SHIFT)),
        ("MAX_PAGE_SHIFT", u64::from(mem::MAX_PAGE_SHIFT)),
        ("ACCESS_LOCAL_WRITE", u64::from(mem::access::LOCAL_WRITE)),
        ("ACCESS_REMOTE_READ", u64::from(mem::access::REMOTE_READ)),
        ("ACCESS_REMOTE_WRITE", u64::from(mem::access::REMOTE_WRITE)),
        (
            "ACCESS_REMOTE_ATOMIC",
            u64::from(mem::access::REMOTE_ATOMIC),
        ),
        ("ACCESS_MW_BIND", u64::from(mem::access::MW_BIND)),
        ("MW_TYPE_1", u64::from(virtio_rdma_abi::verbs::MW_TYPE_1)),
        ("MW_TYPE_2", u64::from(virtio_rdma_abi::verbs::MW_TYPE_2)),
        ("MCAST_QPN", u64::from(virtio_rdma_abi::verbs::MCAST_QPN)),
        ("MAX_XRCD", u64::from(virtio_rdma_abi::verbs::MAX_XRCD)),
        (
            "MAX_MCAST_GRP",
            u64::from(virtio_rdma_abi::verbs::MAX_MCAST_GRP),
        ),
        (
            "MAX_MCAST_QP_ATTACH",
            u64::from(virtio_rdma_abi::verbs::MAX_MCAST_QP_ATTACH),
        ),
        (
            "REREG_TRANSLATION",
            u64::from(virtio_rdma_abi::verbs::REREG_TRANSLATION),
        ),
        ("REREG_PD", u64::from(virtio_rdma_abi::verbs::REREG_PD)),
        (
            "REREG_ACCESS",
            u64::from(virtio_rdma_abi::verbs::REREG_ACCESS),
        ),
        (
            "SRQ_ATTR_MAX_WR",
            u64::from(virtio_rdma_abi::verbs::SRQ_ATTR_MAX_WR),
        ),
        (
            "SRQ_ATTR_LIMIT",
            u64::from(virtio_rdma_abi::verbs::SRQ_ATTR_LIMIT),
        ),
        ("DB_DRIVER_OFFSET", datapath::DB_DRIVER_OFFSET),
        ("DB_DEVICE_OFFSET", datapath::DB_DEVICE_OFFSET),
        ("DB_FLAG_KICK", u64::from(datapath::DB_FLAG_KICK)),
        ("DB_FLAG_POLLING", u64::from(datapath::DB_FLAG_POLLING)),
        ("SHMEM_ID_DOORBELL", u64::from(datapath::SHMEM_ID_DOORBELL)),
        ("DB_PAGE_SIZE", datapath::DB_PAGE_SIZE),
        ("DB_SLOT_OFFSET", datapath::DB_SLOT_OFFSET),
        ("DB_SLOT_SIZE", datapath::DB_SLOT_SIZE),
        ("DB_PAGE_SLOTS", u64::from(datapath::DB_PAGE_SLOTS)),
        ("WQE_SIGNALED", u64::from(datapath::WQE_SIGNALED)),
        ("WQE_SOLICITED", u64::from(datapath::WQE_SOLICITED)),
        ("WQE_INLINE", u64::from(datapath::WQE_INLINE)),
        ("WQE_FENCE", u64::from(datapath::WQE_FENCE)),
        ("CQE_WITH_IMM", u64::from(datapath::CQE_WITH_IMM)),
        ("CQE_GRH", u64::from(datapath::CQE_GRH)),
        ("CQE_SOLICITED", u64::from(datapath::CQE_SOLICITED)),
        ("CQE_WITH_INV", u64::from(datapath::CQE_WITH_INV)),
        (
            "REG_MR_MIN_PAGE_SHIFT",
            u64::from(datapath::REG_MR_MIN_PAGE_SHIFT),
        ),
        (
            "REG_MR_MAX_PAGE_SHIFT",
            u64::from(datapath::REG_MR_MAX_PAGE_SHIFT),
        ),
        ("GSI_QPN", u64::from(virtio_rdma_abi::qp::GSI_QPN)),
        ("GSI_QKEY", u64::from(virtio_rdma_abi::qp::GSI_QKEY)),
        (
            "MAX_MAD_BYTES",
            u64::from(virtio_rdma_abi::qp::MAX_MAD_BYTES),
        ),
        (
            "MAX_GSI_DEPTH",
            u64::from(virtio_rdma_abi::qp::MAX_GSI_DEPTH),
        ),
    ] {
        let _ = writeln!(out, "#define VIRTIO_RDMA_{n} {v}");
    }
    let _ = writeln!(out, "#define VIRTIO_RDMA_DB_NONE 0xffffffffU\n");
    out.push_str("/* MODIFY_QP attribute mask bits (section 12.13). */\n");
    for (n, v) in [
        ("STATE", attr::STATE),
        ("CUR_STATE", attr::CUR_STATE),
        ("ACCESS", attr::ACCESS),
        ("PKEY_INDEX", attr::PKEY_INDEX),
        ("PORT", attr::PORT),
        ("QKEY", attr::QKEY),
        ("AV", attr::AV),
        ("PATH_MTU", attr::PATH_MTU),
        ("TIMEOUT", attr::TIMEOUT),
        ("RETRY_CNT", attr::RETRY_CNT),
        ("RNR_RETRY", attr::RNR_RETRY),
        ("RQ_PSN", attr::RQ_PSN),
        ("MAX_RD_ATOMIC", attr::MAX_RD_ATOMIC),
        ("MIN_RNR_TIMER", attr::MIN_RNR_TIMER),
        ("SQ_PSN", attr::SQ_PSN),
        ("MAX_DEST_RD_ATOMIC", attr::MAX_DEST_RD_ATOMIC),
        ("DEST_QPN", attr::DEST_QPN),
        ("EN_SQD_ASYNC_NOTIFY", attr::EN_SQD_ASYNC_NOTIFY),
    ] {
        let _ = writeln!(out, "#define VIRTIO_RDMA_ATTR_{n} {v:#x}");
    }
    out.push('\n');
    let code = |v: u32| u64::from(v);
    enum_block(
        &mut out,
        "opcode",
        "OP_",
        &Opcode::ALL
            .iter()
            .map(|&o| (o.name(), code(o.into())))
            .collect::<Vec<_>>(),
    );
    enum_block(
        &mut out,
        "page_list_mode",
        "PAGES_",
        &mem::PageListMode::ALL
            .iter()
            .map(|&o| (o.name(), code(o.into())))
            .collect::<Vec<_>>(),
    );
    enum_block(
        &mut out,
        "qp_state",
        "QPS_",
        &QpState::ALL
            .iter()
            .map(|&o| (o.name(), code(o.into())))
            .collect::<Vec<_>>(),
    );
    enum_block(
        &mut out,
        "qp_type",
        "QPT_",
        &QpType::ALL
            .iter()
            .map(|&o| (o.name(), code(o.into())))
            .collect::<Vec<_>>(),
    );
    enum_block(
        &mut out,
        "mtu",
        "",
        &Mtu::ALL
            .iter()
            .map(|&o| (o.name(), code(o.into())))
            .collect::<Vec<_>>(),
    );
    enum_block(
        &mut out,
        "status",
        "S_",
        &Status::ALL
            .iter()
            .map(|&o| (o.name(), code(o.into())))
            .collect::<Vec<_>>(),
    );
    enum_block(
        &mut out,
        "event_kind",
        "EV_",
        &EventKind::ALL
            .iter()
            .map(|&o| (o.name(), code(o.into())))
            .collect::<Vec<_>>(),
    );
    enum_block(
        &mut out,
        "wr_opcode",
        "WR_",
        &WrOpcode::ALL
            .iter()
            .map(|&o| (o.name(), code(o.into())))
            .collect::<Vec<_>>(),
    );
    enum_block(
        &mut out,
        "wc_opcode",
        "WC_",
        &WcOpcode::ALL
            .iter()
            .map(|&o| (o.name(), code(o.into())))
            .collect::<Vec<_>>(),
    );
    enum_block(
        &mut out,
        "wc_status",
        "WC_",
        &WcStatus::ALL
            .iter()
            .map(|&o| (o.name(), code(o.into())))
            .collect::<Vec<_>>(),
    );
    for w in all_structs() {
        let name = snake(w.name);
        let _ = writeln!(out, "struct virtio_rdma_{name} {{");
        for (f, ty) in w.layout.iter().zip(w.types) {
            let _ = writeln!(out, "\t{};", c_field(ty, f.name));
        }
        out.push_str("};\n\n");
        let _ = writeln!(
            out,
            "static_assert(sizeof(struct virtio_rdma_{name}) == {});\n",
            w.size
        );
    }
    out.push_str("#endif /* _VIRTIO_RDMA_ABI_H */\n");
    out
}

#[test]
fn c_header_matches_the_crate() {
    let want = render();
    let path = header_path();
    if std::env::var_os("VIRTIO_RDMA_WRITE_HEADER").is_some() {
        std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is not what the crate says; regenerate it with \
         VIRTIO_RDMA_WRITE_HEADER=1 cargo test -p virtio-rdma-abi --test c_header",
        path.display()
    );
}
