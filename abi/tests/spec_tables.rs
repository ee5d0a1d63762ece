//! Checks the machine-readable tables of `docs/virtio-rdma-spec.md` against
//! this crate.
//!
//! The spec marks each structure layout table with `<!-- layout: Name -->`
//! and each constant table with `<!-- consts: kind -->`. This test parses
//! those tables and requires that they describe exactly what the crate
//! declares: every structure of `all_layouts()` (fields, offsets, sizes, in
//! order), every control opcode, status code, event kind, feature bit,
//! work request opcode, completion opcode and completion status — nothing
//! missing, nothing extra, nothing listed twice.

// Test code: reading the spec file is allowed to abort the test.
#![allow(clippy::expect_used)]

use std::collections::BTreeMap;

use virtio_rdma_abi::ctrl::{Opcode, Status};
use virtio_rdma_abi::datapath::{self, WcOpcode, WcStatus, WrOpcode};
use virtio_rdma_abi::event::EventKind;
use virtio_rdma_abi::{all_layouts, FieldLayout};
use virtio_rdma_abi::{config, mem};

/// Header a layout table must have.
const LAYOUT_HEADER: [&str; 4] = ["Offset", "Size", "Field", "Description"];
/// Header a constant table must have.
const CONSTS_HEADER: [&str; 3] = ["Value", "Name", "Description"];
/// The constant tables the spec must contain.
const CONSTS_KINDS: [&str; 10] = [
    "opcodes",
    "sizes",
    "doorbell_flags",
    "status",
    "events",
    "features",
    "doorbell_region",
    "wr_opcodes",
    "wc_opcodes",
    "wc_status",
];

/// What a marker comment announces.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Marker {
    /// `<!-- layout: StructName -->`
    Layout(String),
    /// `<!-- consts: kind -->`
    Consts(String),
}

impl Marker {
    fn describe(&self) -> String {
        match self {
            Marker::Layout(n) => format!("layout table `{n}`"),
            Marker::Consts(k) => format!("consts table `{k}`"),
        }
    }
}

/// One body row of a table: its 1-based line number in the document and
/// its cells (trimmed, surrounding backticks removed).
#[derive(Debug)]
struct Row {
    line: usize,
    cells: Vec<String>,
}

/// One marked table.
#[derive(Debug)]
struct Table {
    marker: Marker,
    /// 1-based line number of the marker comment.
    line: usize,
    header: Vec<String>,
    rows: Vec<Row>,
}

impl Table {
    fn describe(&self) -> String {
        format!("{} (marker at line {})", self.marker.describe(), self.line)
    }
}

/// Recognises a marker comment line; `Some(Err)` for a comment that looks
/// like a marker but is malformed.
fn parse_marker(line: &str) -> Option<Result<Marker, String>> {
    let t = line.trim();
    let inner = t.strip_prefix("<!--")?.strip_suffix("-->")?.trim();
    let (kind, arg) = inner.split_once(':')?;
    let arg = arg.trim();
    let kind = kind.trim();
    if kind != "layout" && kind != "consts" {
        return None;
    }
    if arg.is_empty() || arg.contains(char::is_whitespace) {
        return Some(Err(format!("malformed marker `{t}`")));
    }
    Some(Ok(if kind == "layout" {
        Marker::Layout(arg.to_string())
    } else {
        Marker::Consts(arg.to_string())
    }))
}

/// Splits a markdown table row into trimmed cells (a `\|` inside a cell
/// is not a separator) and strips one pair of surrounding backticks.
fn split_row(line: &str) -> Vec<String> {
    let t = line.trim();
    let t = t.strip_prefix('|').unwrap_or(t);
    let t = t.strip_suffix('|').unwrap_or(t);
    let mut cells = Vec::new();
    let mut cur = String::new();
    let mut prev_backslash = false;
    for ch in t.chars() {
        if ch == '|' && !prev_backslash {
            cells.push(cur.clone());
            cur.clear();
        } else {
            cur.push(ch);
        }
        prev_backslash = ch == '\\';
    }
    cells.push(cur);
    cells
        .into_iter()
        .map(|c| {
            let c = c.trim();
            c.strip_prefix('`')
                .and_then(|s| s.strip_suffix('`'))
                .unwrap_or(c)
                .to_string()
        })
        .collect()
}

fn is_separator_row(cells: &[String]) -> bool {
    !cells.is_empty()
        && cells.iter().all(|c| {
            let c = c.trim_matches(':');
            !c.is_empty() && c.chars().all(|ch| ch == '-')
        })
}

/// Finds every marked table. Problems (a marker without a table, a table
/// without a separator row, a malformed marker) are returned as errors.
fn parse_tables(md: &str) -> (Vec<Table>, Vec<String>) {
    let lines: Vec<&str> = md.lines().collect();
    let mut tables = Vec::new();
    let mut errors = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let marker = match parse_marker(lines[i]) {
            None => {
                i += 1;
                continue;
            }
            Some(Err(e)) => {
                errors.push(format!("line {}: {e}", i + 1));
                i += 1;
                continue;
            }
            Some(Ok(m)) => m,
        };
        let marker_line = i + 1;
        i += 1;
        while i < lines.len() && lines[i].trim().is_empty() {
            i += 1;
        }
        if i >= lines.len() || !lines[i].trim_start().starts_with('|') {
            errors.push(format!(
                "{} (marker at line {marker_line}): not followed by a table",
                marker.describe()
            ));
            continue;
        }
        let header = split_row(lines[i]);
        i += 1;
        if i >= lines.len() || !is_separator_row(&split_row(lines[i])) {
            errors.push(format!(
                "{} (marker at line {marker_line}): header row is not followed by a `|---|` separator row",
                marker.describe()
            ));
            continue;
        }
        i += 1;
        let mut rows = Vec::new();
        while i < lines.len() && lines[i].trim_start().starts_with('|') {
            rows.push(Row {
                line: i + 1,
                cells: split_row(lines[i]),
            });
            i += 1;
        }
        tables.push(Table {
            marker,
            line: marker_line,
            header,
            rows,
        });
    }
    (tables, errors)
}

/// Parses a decimal number, or a hexadecimal one with a `0x` prefix.
fn parse_number(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn check_header(t: &Table, want: &[&str], errors: &mut Vec<String>) -> bool {
    if t.header.iter().map(String::as_str).eq(want.iter().copied()) {
        true
    } else {
        errors.push(format!(
            "{}: header is {:?}, expected {:?}",
            t.describe(),
            t.header,
            want
        ));
        false
    }
}

/// A structure as the crate declares it: name, field layout, size.
type Layout = (&'static str, &'static [FieldLayout], usize);

/// Checks the layout tables against `layouts`: one table per structure, no
/// table for an unknown structure, rows equal to the layout in order, sizes
/// adding up to the structure size.
fn check_layouts(tables: &[Table], layouts: &[Layout]) -> Vec<String> {
    let mut errors = Vec::new();
    let known: BTreeMap<&str, (&[FieldLayout], usize)> =
        layouts.iter().map(|&(n, l, s)| (n, (l, s))).collect();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();

    for t in tables {
        let Marker::Layout(name) = &t.marker else {
            continue;
        };
        if let Some(first) = seen.insert(name.clone(), t.line) {
            errors.push(format!(
                "{}: duplicate, structure `{name}` already has a table at line {first}",
                t.describe()
            ));
            continue;
        }
        let Some(&(fields, size)) = known.get(name.as_str()) else {
            errors.push(format!(
                "{}: names an unknown structure (not in all_layouts())",
                t.describe()
            ));
            continue;
        };
        if !check_header(t, &LAYOUT_HEADER, &mut errors) {
            continue;
        }

        let mut sum = 0usize;
        let mut next_offset = 0usize;
        for (idx, row) in t.rows.iter().enumerate() {
            let n = idx + 1;
            let at = format!("{} row {n} (line {})", t.describe(), row.line);
            if row.cells.len() != LAYOUT_HEADER.len() {
                errors.push(format!(
                    "{at}: has {} cells, expected {}",
                    row.cells.len(),
                    LAYOUT_HEADER.len()
                ));
                continue;
            }
            let (off_s, size_s, field, desc) =
                (&row.cells[0], &row.cells[1], &row.cells[2], &row.cells[3]);
            let (Ok(off), Ok(sz)) = (off_s.parse::<usize>(), size_s.parse::<usize>()) else {
                errors.push(format!(
                    "{at}: Offset `{off_s}` and Size `{size_s}` must be decimal numbers"
                ));
                continue;
            };
            if desc.is_empty() {
                errors.push(format!("{at}: field `{field}` has an empty description"));
            }
            if off != next_offset {
                errors.push(format!(
                    "{at}: field `{field}` at offset {off}, but the previous rows end at {next_offset}"
                ));
            }
            next_offset = off + sz;
            sum += sz;
            match fields.get(idx) {
                Some(f) if f.name == field && f.offset == off && f.size == sz => {}
                Some(f) => errors.push(format!(
                    "{at}: table says `{field}` offset {off} size {sz}, ABI says `{}` offset {} size {}",
                    f.name, f.offset, f.size
                )),
                None => errors.push(format!(
                    "{at}: extra row `{field}`; the ABI structure has only {} fields",
                    fields.len()
                )),
            }
        }
        for f in fields.iter().skip(t.rows.len()) {
            errors.push(format!(
                "{}: missing row for field `{}` (offset {}, size {})",
                t.describe(),
                f.name,
                f.offset,
                f.size
            ));
        }
        if sum != size {
            errors.push(format!(
                "{}: row sizes add up to {sum}, but the structure size is {size}",
                t.describe()
            ));
        }
    }

    for &(name, _, _) in layouts {
        if !seen.contains_key(name) {
            errors.push(format!(
                "structure `{name}` has no `<!-- layout: {name} -->` table"
            ));
        }
    }
    errors
}

/// Checks the constant table of `kind` against `expected` (name, value):
/// exactly one table, each constant exactly once with its value, no
/// unknown names.
fn check_consts(tables: &[Table], kind: &str, expected: &[(&str, u64)]) -> Vec<String> {
    let mut errors = Vec::new();
    let marker = Marker::Consts(kind.to_string());
    let matching: Vec<&Table> = tables.iter().filter(|t| t.marker == marker).collect();
    let t = match matching.as_slice() {
        [] => return vec![format!("no `<!-- consts: {kind} -->` table in the spec")],
        [t] => *t,
        [first, rest @ ..] => {
            for r in rest {
                errors.push(format!(
                    "{}: duplicate, first table at line {}",
                    r.describe(),
                    first.line
                ));
            }
            *first
        }
    };
    if !check_header(t, &CONSTS_HEADER, &mut errors) {
        return errors;
    }
    let want: BTreeMap<&str, u64> = expected.iter().copied().collect();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (idx, row) in t.rows.iter().enumerate() {
        let at = format!("{} row {} (line {})", t.describe(), idx + 1, row.line);
        if row.cells.len() != CONSTS_HEADER.len() {
            errors.push(format!(
                "{at}: has {} cells, expected {}",
                row.cells.len(),
                CONSTS_HEADER.len()
            ));
            continue;
        }
        let (value_s, name, desc) = (&row.cells[0], &row.cells[1], &row.cells[2]);
        if desc.is_empty() {
            errors.push(format!("{at}: `{name}` has an empty description"));
        }
        let Some(value) = parse_number(value_s) else {
            errors.push(format!(
                "{at}: value `{value_s}` is neither decimal nor 0x-hexadecimal"
            ));
            continue;
        };
        if let Some(first) = seen.insert(name.clone(), row.line) {
            errors.push(format!(
                "{at}: `{name}` is listed twice (first at line {first})"
            ));
            continue;
        }
        match want.get(name.as_str()) {
            None => errors.push(format!("{at}: `{name}` is not a known {kind} constant")),
            Some(&v) if v != value => errors.push(format!(
                "{at}: `{name}` has value {value_s} in the table, {v:#x} in the ABI"
            )),
            Some(_) => {}
        }
    }
    for (name, value) in expected {
        if !seen.contains_key(*name) {
            errors.push(format!(
                "{}: missing row for `{name}` (value {value:#x})",
                t.describe()
            ));
        }
    }
    errors
}

/// Every feature bit the crate defines, by constant name.
fn feature_constants() -> Vec<(&'static str, u64)> {
    vec![
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
    ]
}

fn expected_consts(kind: &str) -> Vec<(&'static str, u64)> {
    match kind {
        "opcodes" => Opcode::ALL
            .iter()
            .map(|&o| (o.name(), u64::from(u32::from(o))))
            .collect(),
        "status" => Status::ALL
            .iter()
            .map(|&s| (s.name(), u64::from(u32::from(s))))
            .collect(),
        "events" => EventKind::ALL
            .iter()
            .map(|&e| (e.name(), u64::from(u32::from(e))))
            .collect(),
        "features" => feature_constants(),
        "sizes" => vec![
            ("CQE_SIZE", u64::from(mem::CQE_SIZE)),
            ("SEND_WQE_HEADER", u64::from(mem::SEND_WQE_HEADER)),
            ("RECV_WQE_HEADER", u64::from(mem::RECV_WQE_HEADER)),
            ("SGE_SIZE", u64::from(mem::SGE_SIZE)),
            ("DB_RECORD_SIZE", mem::DB_RECORD_SIZE),
        ],
        "doorbell_flags" => vec![
            ("DB_DRIVER_OFFSET", datapath::DB_DRIVER_OFFSET),
            ("DB_DEVICE_OFFSET", datapath::DB_DEVICE_OFFSET),
            ("DB_FLAG_KICK", u64::from(datapath::DB_FLAG_KICK)),
            ("DB_FLAG_POLLING", u64::from(datapath::DB_FLAG_POLLING)),
        ],
        "doorbell_region" => vec![
            ("SHMEM_ID_DOORBELL", u64::from(datapath::SHMEM_ID_DOORBELL)),
            ("DB_PAGE_SIZE", datapath::DB_PAGE_SIZE),
            ("DB_SLOT_OFFSET", datapath::DB_SLOT_OFFSET),
            ("DB_SLOT_SIZE", datapath::DB_SLOT_SIZE),
            ("DB_PAGE_SLOTS", u64::from(datapath::DB_PAGE_SLOTS)),
            ("DB_NONE", u64::from(datapath::DB_NONE)),
        ],
        "wr_opcodes" => WrOpcode::ALL
            .iter()
            .map(|&o| (o.name(), u64::from(u32::from(o))))
            .collect(),
        "wc_opcodes" => WcOpcode::ALL
            .iter()
            .map(|&o| (o.name(), u64::from(u32::from(o))))
            .collect(),
        "wc_status" => WcStatus::ALL
            .iter()
            .map(|&s| (s.name(), u64::from(u32::from(s))))
            .collect(),
        _ => Vec::new(),
    }
}

/// Runs every check on a whole document.
fn check_document(md: &str) -> Vec<String> {
    let (tables, mut errors) = parse_tables(md);
    errors.extend(check_layouts(&tables, &all_layouts()));
    for kind in CONSTS_KINDS {
        errors.extend(check_consts(&tables, kind, &expected_consts(kind)));
    }
    for t in &tables {
        if let Marker::Consts(k) = &t.marker {
            if !CONSTS_KINDS.contains(&k.as_str()) {
                errors.push(format!("{}: unknown constant table kind", t.describe()));
            }
        }
    }
    errors
}

/// Every "`Name (N)`" in the text — a structure of the crate followed by a
/// size in parentheses, as the command summary of section 7.6 writes them —
/// must give the structure's real size: a driver author trusts them.
fn check_size_mentions(md: &str) -> Vec<String> {
    let sizes: BTreeMap<&str, usize> = all_layouts()
        .into_iter()
        .map(|(name, _, size)| (name, size))
        .collect();
    let mut errors = Vec::new();
    for (n, line) in md.lines().enumerate() {
        for (name, size) in &sizes {
            let mut rest = line;
            while let Some(i) = rest.find(name) {
                let after = &rest[i + name.len()..];
                let before_ok = rest[..i]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !c.is_ascii_alphanumeric());
                if before_ok {
                    if let Some(num) = after
                        .strip_prefix(" (")
                        .and_then(|a| a.split(')').next())
                        .and_then(|d| d.parse::<usize>().ok())
                    {
                        if num != *size {
                            errors.push(format!(
                                "line {}: {name} ({num}), but the structure is {size} bytes",
                                n + 1
                            ));
                        }
                    }
                }
                rest = after;
            }
        }
    }
    errors
}

#[test]
fn sizes_mentioned_in_the_text_match_abi() {
    let errors = check_size_mentions(&spec_text());
    assert!(errors.is_empty(), "{}", report(&errors));
}

#[test]
fn size_mentions_checker_reports_a_wrong_size() {
    let (name, _, size) = all_layouts()[0];
    let md = format!("| X | {name} ({}) |\n| Y | {name} ({size}) |\n", size + 4);
    let errors = check_size_mentions(&md);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].starts_with("line 1:"), "{errors:?}");
}

fn spec_text() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/virtio-rdma-spec.md");
    std::fs::read_to_string(path).expect("read docs/virtio-rdma-spec.md")
}

fn report(errors: &[String]) -> String {
    format!(
        "{} problem(s) between docs/virtio-rdma-spec.md and the ABI crate:\n  {}",
        errors.len(),
        errors.join("\n  ")
    )
}

#[test]
fn spec_tables_match_abi() {
    let errors = check_document(&spec_text());
    assert!(errors.is_empty(), "{}", report(&errors));
}

#[test]
fn every_structure_and_constant_table_is_present() {
    let (tables, errors) = parse_tables(&spec_text());
    assert!(errors.is_empty(), "{}", report(&errors));
    let layouts = tables
        .iter()
        .filter(|t| matches!(t.marker, Marker::Layout(_)))
        .count();
    assert_eq!(
        layouts,
        all_layouts().len(),
        "one layout table per structure"
    );
    for kind in CONSTS_KINDS {
        let n = tables
            .iter()
            .filter(|t| t.marker == Marker::Consts(kind.to_string()))
            .count();
        assert_eq!(n, 1, "consts table `{kind}`");
    }
}

#[test]
fn feature_list_covers_every_device_feature() {
    let features = feature_constants();
    let mut all = 0u64;
    for (name, bit) in &features {
        assert_eq!(bit.count_ones(), 1, "{name} must be a single bit");
        assert_eq!(all & bit, 0, "{name} overlaps another feature bit");
        all |= bit;
    }
    assert_eq!(
        all,
        config::ALL_DEVICE_FEATURES,
        "a feature bit was added to the crate but not to this test's list"
    );
}

// ---- tests of the checker itself -------------------------------------------

/// The ABI's BufferDesc only, so the inline documents below need no other
/// tables.
fn buffer_desc_only() -> Vec<Layout> {
    all_layouts()
        .into_iter()
        .filter(|l| l.0 == "BufferDesc")
        .collect()
}

const GOOD_BUFFER_DESC: &str = "\
Some text.

<!-- layout: BufferDesc -->
| Offset | Size | Field | Description |
|---|---|---|---|
| 0 | 8 | addr | le64. Address. |
| 8 | 4 | npages | le32. Pages. |
| 12 | 4 | first_page_offset | le32. Offset. |
| 16 | 4 | page_shift | le32. Shift. |
| 20 | 4 | `mode` | le32. Mode. |

More text.
";

#[test]
fn checker_accepts_a_correct_table() {
    let (tables, errors) = parse_tables(GOOD_BUFFER_DESC);
    assert!(errors.is_empty(), "{errors:?}");
    let errors = check_layouts(&tables, &buffer_desc_only());
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn checker_reports_a_wrong_offset() {
    let md = GOOD_BUFFER_DESC.replace("| 16 | 4 | page_shift |", "| 20 | 4 | page_shift |");
    let (tables, parse_errors) = parse_tables(&md);
    assert!(parse_errors.is_empty(), "{parse_errors:?}");
    let errors = check_layouts(&tables, &buffer_desc_only());
    assert!(!errors.is_empty(), "a wrong offset must be reported");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("layout table `BufferDesc`")
                && e.contains("row 4 (line 9)")
                && e.contains("offset 20")
                && e.contains("ABI says `page_shift` offset 16")),
        "the message must name the table, the row and both offsets: {errors:?}"
    );
}

#[test]
fn checker_reports_missing_extra_and_unknown_tables() {
    // A missing field row.
    let md = GOOD_BUFFER_DESC.replace("| 20 | 4 | `mode` | le32. Mode. |\n", "");
    let (tables, _) = parse_tables(&md);
    let errors = check_layouts(&tables, &buffer_desc_only());
    assert!(
        errors
            .iter()
            .any(|e| e.contains("missing row for field `mode`")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("add up to 20")),
        "{errors:?}"
    );

    // A table for a structure the crate does not have, and none for BufferDesc.
    let md = GOOD_BUFFER_DESC.replace("layout: BufferDesc", "layout: BufferDescX");
    let (tables, _) = parse_tables(&md);
    let errors = check_layouts(&tables, &buffer_desc_only());
    assert!(
        errors
            .iter()
            .any(|e| e.contains("`BufferDescX`") && e.contains("unknown structure")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("`BufferDesc` has no")),
        "{errors:?}"
    );

    // A marker with no table after it.
    let (_, errors) = parse_tables("<!-- layout: BufferDesc -->\n\ntext\n");
    assert!(
        errors.iter().any(|e| e.contains("not followed by a table")),
        "{errors:?}"
    );
}

#[test]
fn checker_reports_constant_mismatches() {
    let md = "\
<!-- consts: status -->
| Value | Name | Description |
|---|---|---|
| 0 | OK | Fine. |
| 0x2 | UNSUPPORTED | Wrong value. |
| 99 | NOT_A_STATUS | Unknown. |
";
    let (tables, parse_errors) = parse_tables(md);
    assert!(parse_errors.is_empty(), "{parse_errors:?}");
    let errors = check_consts(&tables, "status", &expected_consts("status"));
    assert!(
        errors
            .iter()
            .any(|e| e.contains("row 2 (line 5)") && e.contains("`UNSUPPORTED` has value 0x2")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("`NOT_A_STATUS` is not a known")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("missing row for `INTERNAL`")),
        "{errors:?}"
    );
    let errors = check_consts(&tables, "events", &expected_consts("events"));
    assert!(
        errors
            .iter()
            .any(|e| e.contains("no `<!-- consts: events -->` table")),
        "{errors:?}"
    );
}

#[test]
fn every_constant_kind_has_expected_values() {
    for kind in CONSTS_KINDS {
        let expected = expected_consts(kind);
        assert!(!expected.is_empty(), "no expected constants for `{kind}`");
        let mut names: Vec<&str> = expected.iter().map(|&(n, _)| n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), expected.len(), "duplicate names in `{kind}`");
    }
    assert_eq!(expected_consts("wr_opcodes").len(), WrOpcode::ALL.len());
    assert_eq!(expected_consts("wc_opcodes").len(), WcOpcode::ALL.len());
    assert_eq!(expected_consts("wc_status").len(), WcStatus::ALL.len());
}

#[test]
fn checker_reports_data_path_constant_mismatches() {
    // Hexadecimal and decimal values are both accepted (RECV is 0x80 = 128);
    // a wrong value, an unknown name and a missing name are each reported.
    let md = "\
<!-- consts: wc_opcodes -->
| Value | Name | Description |
|---|---|---|
| 0 | SEND | A send. |
| 1 | RDMA_WRITE | A write. |
| 3 | RDMA_READ | Wrong value. |
| 3 | COMP_SWAP | Compare and swap. |
| 4 | FETCH_ADD | Fetch and add. |
| 128 | RECV | A receive. |
| 0x82 | RECV_WITH_INV | Unknown. |
";
    let (tables, parse_errors) = parse_tables(md);
    assert!(parse_errors.is_empty(), "{parse_errors:?}");
    let errors = check_consts(&tables, "wc_opcodes", &expected_consts("wc_opcodes"));
    assert!(
        errors
            .iter()
            .any(|e| e.contains("row 3 (line 6)") && e.contains("`RDMA_READ` has value 3")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("`RECV_WITH_INV` is not a known wc_opcodes constant")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("missing row for `RECV_RDMA_WITH_IMM` (value 0x81)")),
        "{errors:?}"
    );
    assert!(
        !errors.iter().any(|e| e.contains("`RECV`")),
        "RECV (128 = 0x80) is correct: {errors:?}"
    );
    let errors = check_consts(&tables, "wc_status", &expected_consts("wc_status"));
    assert!(
        errors
            .iter()
            .any(|e| e.contains("no `<!-- consts: wc_status -->` table")),
        "{errors:?}"
    );
}
