//! Prometheus metrics over HTTP: `GET /metrics` answers in the text
//! exposition format 0.0.4, `GET /healthz` with `ok`.
//!
//! The page is the `prometheus` crate's: a [`Collector`] builds the
//! families from the daemon's view at every scrape (the counters live in
//! the daemon; none are kept twice) and its `TextEncoder` writes them.
//! Not `prometheus-client` (0.25.2, measured): it writes only OpenMetrics
//! 1.0, which would change what scrapers see: the content type, counter
//! families named without `_total` in `# HELP`/`# TYPE`, a closing
//! `# EOF`, and histogram buckets as `le="1.0"` placed before the other
//! labels (for Prometheus 2 a new series, so dashboards selecting `le`
//! break). docs/operations.md promises 0.0.4 with the names as they are.
//!
//! The HTTP server is deliberately minimal and hand-written: one request
//! per connection (`Connection: close`), request headers of at most
//! [`MAX_HEADER`] bytes read within [`READ_TIMEOUT`], a thread per
//! connection and at most [`MAX_CONNECTIONS`] of them (more get `503`), so
//! a slow client delays nobody else. Other paths get `404`, other methods
//! `405`. `tiny_http` (0.12.0, read) keeps none of these limits: it reads a
//! header line without a length cap, sets no socket timeout and offers no
//! way to, and starts a thread for every connection without a cap, so a
//! few silent clients would hold threads and memory for ever; a crate on
//! an async runtime (hyper, axum) would bring the runtime for one page.
//!
//! Every series has the label `vm` and `tenant` (per VM) or `tenant` (per
//! tenant, the sum over its VMs); [`render`] lists them.

use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use log::debug;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Registry, TextEncoder};
use thiserror::Error;

use crate::conn_pool::{self, linger_close};
use crate::engine::EngineStats;
use crate::qos::QosSpec;
use crate::snapshot::{self, Totals};
use crate::stats::{HistogramSnapshot, TrafficStats, LATENCY_BOUNDS_US};
use crate::view::DaemonView;

/// Largest request head (request line and headers) in bytes.
pub const MAX_HEADER: usize = 8 * 1024;
/// Time a client has to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;

/// Errors setting up the metrics listener.
#[derive(Debug, Error)]
pub enum MetricsError {
    /// The address could not be bound.
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The accepting thread could not be spawned.
    #[error("cannot spawn the metrics thread: {0}")]
    Spawn(std::io::Error),
}

/// A running metrics HTTP server.
pub struct MetricsServer {
    addr: SocketAddr,
    /// A second descriptor of the listening socket, for a hand-over.
    listener: OwnedFd,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` (port 0: any free port) and serves `view`.
    pub fn start(addr: SocketAddr, view: DaemonView) -> Result<MetricsServer, MetricsError> {
        let bind_err = |source| MetricsError::Bind { addr, source };
        Self::adopt(TcpListener::bind(addr).map_err(bind_err)?, view)
    }

    /// Serves `view` on `listener` (bound by the daemon this one took
    /// over from).
    pub fn adopt(listener: TcpListener, view: DaemonView) -> Result<MetricsServer, MetricsError> {
        let local = listener.local_addr();
        let addr = local.map_err(|source| MetricsError::Bind {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })?;
        let bind_err = |source| MetricsError::Bind { addr, source };
        let dup = listener.try_clone().map_err(bind_err)?.into();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = thread::Builder::new()
            .name("metrics".into())
            .spawn(move || accept_loop(listener, registry(&view), s))
            .map_err(MetricsError::Spawn)?;
        Ok(MetricsServer {
            addr,
            listener: dup,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The listening socket.
    pub fn listener(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Stops serving and waits for the connection threads.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accepting thread (an unspecified address is reachable
        // through loopback).
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, registry: Registry, stop: Arc<AtomicBool>) {
    let busy = response(503, "Service Unavailable", "text/plain", b"busy\n", &[]);
    conn_pool::accept_loop(
        ("metrics", "metrics-conn", MAX_CONNECTIONS),
        listener.incoming(),
        &stop,
        |_| true,
        &busy,
        move |stream| {
            if let Err(e) = serve_conn(stream, &registry) {
                debug!("metrics connection: {e}");
            }
        },
    );
}

/// An HTTP response, whole.
fn response(
    code: u16,
    reason: &str,
    content_type: &str,
    body: &[u8],
    extra: &[(&str, &str)],
) -> Vec<u8> {
    let mut head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in extra {
        let _ = write!(head, "{k}: {v}\r\n");
    }
    head.push_str("\r\n");
    let mut r = head.into_bytes();
    r.extend_from_slice(body);
    r
}

fn respond(
    stream: &mut TcpStream,
    code: u16,
    reason: &str,
    content_type: &str,
    body: &[u8],
    extra: &[(&str, &str)],
) -> std::io::Result<()> {
    stream.write_all(&response(code, reason, content_type, body, extra))?;
    stream.flush()
}

/// Reads the request head (up to the blank line); `None` if it is too
/// large, `Err` on timeout or I/O error.
fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            return Ok(Some(buf));
        }
        if buf.len() > MAX_HEADER {
            return Ok(None);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut chunk) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf.extend_from_slice(chunk.get(..n).unwrap_or(&[])),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn serve_conn(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    let r = answer(&mut stream, registry);
    if r.is_ok() {
        linger_close(&mut stream);
    }
    r
}

fn answer(stream: &mut TcpStream, registry: &Registry) -> std::io::Result<()> {
    let Some(head) = read_head(stream)? else {
        return respond(
            stream,
            431,
            "Request Header Fields Too Large",
            "text/plain",
            b"request header too large\n",
            &[],
        );
    };
    let text = String::from_utf8_lossy(&head);
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return respond(
            stream,
            400,
            "Bad Request",
            "text/plain",
            b"bad request\n",
            &[],
        );
    };
    if !version.starts_with("HTTP/1.") {
        return respond(
            stream,
            400,
            "Bad Request",
            "text/plain",
            b"bad request\n",
            &[],
        );
    }
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" {
        return respond(
            stream,
            405,
            "Method Not Allowed",
            "text/plain",
            b"method not allowed\n",
            &[("Allow", "GET")],
        );
    }
    match path {
        "/metrics" => {
            let body = encode(registry);
            respond(
                stream,
                200,
                "OK",
                "text/plain; version=0.0.4; charset=utf-8",
                body.as_bytes(),
                &[],
            )
        }
        "/healthz" => respond(stream, 200, "OK", "text/plain", b"ok\n", &[]),
        _ => respond(stream, 404, "Not Found", "text/plain", b"not found\n", &[]),
    }
}

/// A metric family of the page, being given its samples.
struct Family<'a>(&'a mut MetricFamily);

impl<'a> Family<'a> {
    fn new(
        out: &'a mut Vec<MetricFamily>,
        name: impl Into<String>,
        kind: MetricType,
        help: &str,
    ) -> Self {
        let mut f = MetricFamily::default();
        f.set_name(name.into());
        f.set_help(help.into());
        f.set_field_type(kind);
        let i = out.len();
        out.push(f);
        Family(&mut out[i])
    }

    fn metric(labels: &[(&str, &str)]) -> Metric {
        let mut m = Metric::default();
        m.set_label(
            labels
                .iter()
                .map(|(k, v)| {
                    let mut l = LabelPair::default();
                    l.set_name((*k).into());
                    l.set_value((*v).into());
                    l
                })
                .collect(),
        );
        m
    }

    /// A counter's or gauge's sample (the family's type decides).
    fn sample(&mut self, labels: &[(&str, &str)], value: u64) {
        let mut m = Self::metric(labels);
        let value = value as f64;
        if self.0.get_field_type() == MetricType::COUNTER {
            let mut c = proto::Counter::default();
            c.set_value(value);
            m.set_counter(c);
        } else {
            let mut g = proto::Gauge::default();
            g.set_value(value);
            m.set_gauge(g);
        }
        self.0.mut_metric().push(m);
    }

    /// A histogram's samples: cumulative buckets at [`LATENCY_BOUNDS_US`]
    /// in seconds (the encoder adds `+Inf`, the count), the sum in seconds.
    fn histogram(&mut self, labels: &[(&str, &str)], h: &HistogramSnapshot) {
        let mut cumulative = 0u64;
        let buckets = LATENCY_BOUNDS_US
            .iter()
            .zip(&h.buckets)
            .map(|(us, n)| {
                cumulative += n;
                let mut b = proto::Bucket::default();
                b.set_upper_bound(*us as f64 / 1e6);
                b.set_cumulative_count(cumulative);
                b
            })
            .collect();
        let mut p = proto::Histogram::default();
        p.set_bucket(buckets);
        p.set_sample_count(h.count);
        p.set_sample_sum(h.sum_ns as f64 / 1e9);
        let mut m = Self::metric(labels);
        m.set_histogram(p);
        self.0.mut_metric().push(m);
    }
}

/// Everything exported about one VM (the sums of one VM) or one tenant.
struct Subject {
    labels: Vec<(&'static str, String)>,
    t: Totals,
    qos: Option<QosSpec>,
}

impl Subject {
    fn labels(&self) -> Vec<(&str, &str)> {
        self.labels.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }
}

/// A scalar exported for every subject.
type Getter = fn(&Totals) -> u64;
/// A QoS value exported as a gauge.
type QosGetter = fn(&QosSpec) -> u64;

/// Scalar series: (name suffix, type, help, value).
const SCALARS: [(&str, MetricType, &str, Getter); 11] = [
    (
        "queued_send_wqes",
        MetricType::GAUGE,
        "Send work requests posted and not yet completed by the device.",
        |t| t.queues.send_wqes,
    ),
    (
        "queued_recv_wqes",
        MetricType::GAUGE,
        "Receive work requests posted to QPs' own receive queues, not yet consumed.",
        |t| t.queues.recv_wqes,
    ),
    (
        "queued_srq_wqes",
        MetricType::GAUGE,
        "Receive work requests posted to shared receive queues, not yet consumed.",
        |t| t.queues.srq_wqes,
    ),
    (
        "events_pending",
        MetricType::GAUGE,
        "Asynchronous events waiting for an event buffer.",
        |t| t.queues.events_pending,
    ),
    (
        "connected",
        MetricType::GAUGE,
        "Whether a VMM is connected (per tenant: connected VMs).",
        |t| t.connected,
    ),
    (
        "stats_stale",
        MetricType::GAUGE,
        "1 when the VM's object and queue values are last-known ones (its state lock was busy for the scrape); per tenant: how many VMs.",
        |t| t.stale,
    ),
    (
        "connections_total",
        MetricType::COUNTER,
        "VMM connections accepted.",
        |t| t.connections,
    ),
    (
        "registered_bytes",
        MetricType::GAUGE,
        "Bytes registered by live memory regions.",
        |t| t.resources.registered_bytes,
    ),
    (
        "host_bytes",
        MetricType::GAUGE,
        "Host memory the daemon holds for live objects (translations, queue and object state); limit max_host_bytes.",
        |t| t.resources.host_bytes,
    ),
    (
        "events_lost_total",
        MetricType::COUNTER,
        "Asynchronous events dropped for lack of event buffers.",
        |t| t.events_lost,
    ),
    (
        "ctrl_malformed_total",
        MetricType::COUNTER,
        "Control requests that could not be answered at all.",
        |t| t.ctrl.malformed,
    ),
];

fn subjects(view: &DaemonView) -> (Vec<Subject>, Vec<Subject>) {
    let snaps = snapshot::vms(view);
    let tenants = snapshot::tenant_totals(view, &snaps)
        .into_iter()
        .enumerate()
        .map(|(i, t)| Subject {
            labels: vec![(
                "tenant",
                view.tenancy()
                    .tenants()
                    .get(i)
                    .map(|e| e.name.clone())
                    .unwrap_or_default(),
            )],
            t,
            qos: view.qos().tenant(i),
        })
        .collect();
    let vms = snaps
        .into_iter()
        .map(|s| {
            let mut t = Totals::default();
            t.add(&s);
            Subject {
                labels: vec![("vm", s.name), ("tenant", s.tenant_name)],
                t,
                qos: s.qos,
            }
        })
        .collect();
    (vms, tenants)
}

/// A family whose samples split one subject's value by an extra label
/// `label` (its values and counts from `values`).
fn labeled(
    out: &mut Vec<MetricFamily>,
    name: &str,
    (kind, help): (MetricType, &str),
    (label, subjects): (&'static str, &[Subject]),
    values: impl Fn(&Totals) -> Vec<(&'static str, u64)>,
) {
    let mut f = Family::new(out, name.to_string(), kind, help);
    for s in subjects {
        for (v, n) in values(&s.t) {
            let mut l = s.labels();
            l.push((label, v));
            f.sample(&l, n);
        }
    }
}

/// Writes the families of `subjects` with the name prefix `prefix`
/// (`vhost_user_rdma_vm_` or `vhost_user_rdma_tenant_`).
fn render_subjects(out: &mut Vec<MetricFamily>, prefix: &str, subjects: &[Subject]) {
    for (name, kind, help, get) in SCALARS {
        let mut f = Family::new(out, format!("{prefix}{name}"), kind, help);
        for s in subjects {
            f.sample(&s.labels(), get(&s.t));
        }
    }
    // The traffic counters, named in their one list (stats.rs).
    for (i, metric) in TrafficStats::METRICS.iter().enumerate() {
        let Some((name, help)) = metric else {
            continue;
        };
        let mut f = Family::new(out, format!("{prefix}{name}"), MetricType::COUNTER, help);
        for s in subjects {
            if let Some((_, v)) = s.t.traffic.fields().get(i) {
                f.sample(&s.labels(), *v);
            }
        }
    }
    labeled(
        out,
        &format!("{prefix}objects"),
        (
            MetricType::GAUGE,
            "Live objects by kind (ctx, pd, cq, qp, mr, srq, ah).",
        ),
        ("kind", subjects),
        |t| {
            let r = &t.resources;
            [
                ("ctx", r.ctx),
                ("pd", r.pd),
                ("cq", r.cq),
                ("qp", r.qp),
                ("mr", r.mr),
                ("srq", r.srq),
                ("ah", r.ah),
            ]
            .map(|(k, n)| (k, n as u64))
            .to_vec()
        },
    );
    // A host RNIC's objects and the daemon's mappings (verbs RNIC).
    if subjects.iter().any(|s| s.t.host.is_some()) {
        let mut f = Family::new(
            out,
            format!("{prefix}host_quota"),
            MetricType::GAUGE,
            "Part of the host RNIC and of the daemon's memory mappings, by kind (maps, qp, cq, mr, pd, ah, srq) and value (configured limit, share of the host, effective limit, used).",
        );
        for s in subjects {
            for r in s.t.host.iter().flat_map(|h| h.rows.iter()) {
                for (v, n) in [
                    ("configured", r.configured),
                    ("share", r.share),
                    ("effective", r.effective),
                    ("used", r.used),
                ] {
                    let mut l = s.labels();
                    l.push(("kind", r.kind));
                    l.push(("value", v));
                    f.sample(&l, n);
                }
            }
        }
    }
    labeled(
        out,
        &format!("{prefix}ctrl_completed_total"),
        (
            MetricType::COUNTER,
            "Control commands completed by the device, by result (ok, failed).",
        ),
        ("result", subjects),
        |t| vec![("ok", t.ctrl.ok), ("failed", t.ctrl.failed)],
    );
    labeled(
        out,
        &format!("{prefix}isolation_events_total"),
        (
            MetricType::COUNTER,
            "Isolation events caused, by kind (denied, foreign_drops, foreign_rc, unknown_qpn, bad_rkey, gid_spoof, privileged).",
        ),
        ("kind", subjects),
        |t| {
            let c = &t.isolation;
            vec![
                ("denied", c.denied),
                ("foreign_drops", c.foreign_drops),
                ("foreign_rc", c.foreign_rc),
                ("unknown_qpn", c.unknown_qpn),
                ("bad_rkey", c.bad_rkey),
                ("gid_spoof", c.gid_spoof),
                ("privileged", c.privileged),
            ]
        },
    );
    let mut f = Family::new(
        out,
        format!("{prefix}ctrl_latency_seconds"),
        MetricType::HISTOGRAM,
        "Time from taking a control request to its response, in seconds.",
    );
    for s in subjects {
        f.histogram(&s.labels(), &s.t.traffic.ctrl_latency);
    }
    let qos: [(&str, &str, QosGetter); 4] = [
        (
            "qos_weight",
            "QoS weight (a tenant's share among tenants with work; a VM's share of its tenant's part).",
            |q| u64::from(q.weight),
        ),
        (
            "qos_bytes_per_second",
            "QoS limit of payload bytes per second (0: unlimited).",
            |q| q.bytes_per_sec,
        ),
        (
            "qos_ops_per_second",
            "QoS limit of send work requests per second (0: unlimited).",
            |q| q.ops_per_sec,
        ),
        (
            "qos_ctrl_per_second",
            "QoS limit of control commands per second (0: unlimited).",
            |q| q.ctrl_per_sec,
        ),
    ];
    for (name, help, get) in qos {
        let mut f = Family::new(out, format!("{prefix}{name}"), MetricType::GAUGE, help);
        for s in subjects {
            if let Some(q) = &s.qos {
                f.sample(&s.labels(), get(q));
            }
        }
    }
}

/// The daemon's metrics, collected anew from its view at every scrape
/// (the counters live in the daemon, not here): `vhost_user_rdma_info`,
/// every VM's series (`vhost_user_rdma_vm_*{vm,tenant}`), every tenant's
/// sums (`vhost_user_rdma_tenant_*{tenant}`, plus
/// `vhost_user_rdma_tenant_vms`) and the engine threads'.
struct Snapshot(DaemonView);

impl Collector for Snapshot {
    fn desc(&self) -> Vec<&Desc> {
        // Families come and go with the configuration (no engine, no QoS):
        // nothing to declare up front.
        Vec::new()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let view = &self.0;
        let mut out = Vec::with_capacity(128);
        let mut f = Family::new(
            &mut out,
            "vhost_user_rdma_info",
            MetricType::GAUGE,
            "Daemon version (always 1).",
        );
        f.sample(&[("version", env!("CARGO_PKG_VERSION"))], 1);
        let (vms, tenants) = subjects(view);
        render_subjects(&mut out, "vhost_user_rdma_vm_", &vms);
        render_subjects(&mut out, "vhost_user_rdma_tenant_", &tenants);
        let mut f = Family::new(
            &mut out,
            "vhost_user_rdma_tenant_vms",
            MetricType::GAUGE,
            "VMs configured in the tenant.",
        );
        for t in &tenants {
            f.sample(&t.labels(), t.t.vms);
        }
        render_engines(&mut out, &view.engine_stats());
        out
    }
}

/// A registry holding the daemon's metrics (collected at each gather).
pub fn registry(view: &DaemonView) -> Registry {
    let r = Registry::new();
    // A collector without descriptors cannot clash with another.
    let _ = r.register(Box::new(Snapshot(view.clone())));
    r
}

/// The metrics page of `registry` in the text format 0.0.4.
fn encode(registry: &Registry) -> String {
    let mut out = String::with_capacity(16 * 1024);
    // Encoding fails only for a family without samples or name, which
    // gathering prunes.
    let _ = TextEncoder::new().encode_utf8(&registry.gather(), &mut out);
    out
}

/// The metrics page of `view` (what `GET /metrics` answers).
pub fn render(view: &DaemonView) -> String {
    encode(&registry(view))
}

/// `vhost_user_rdma_engine_*{engine}`: the engine threads' work.
fn render_engines(out: &mut Vec<MetricFamily>, engines: &[EngineStats]) {
    type Get = fn(&EngineStats) -> u64;
    let families: [(&str, MetricType, &str, Get); 9] = [
        (
            "vms",
            MetricType::GAUGE,
            "VMs served by the engine thread.",
            |e| e.vms as u64,
        ),
        (
            "wqes_total",
            MetricType::COUNTER,
            "Send work requests the engine thread executed.",
            |e| e.wqes,
        ),
        (
            "bytes_total",
            MetricType::COUNTER,
            "Payload bytes the engine thread moved.",
            |e| e.bytes,
        ),
        (
            "parks_total",
            MetricType::COUNTER,
            "Times the engine thread went to sleep for want of work.",
            |e| e.parks,
        ),
        (
            "vm_parks_total",
            MetricType::COUNTER,
            "Times the engine thread parked a VM on its own while it polled others.",
            |e| e.vm_parks,
        ),
        (
            "peeked_total",
            MetricType::COUNTER,
            "Times the busy engine thread found a parked VM's work by peeking at its doorbells.",
            |e| e.peeked,
        ),
        (
            "late_kicks_total",
            MetricType::COUNTER,
            "Times the engine thread's re-check after a sleep found a parked VM's work whose notification had not arrived.",
            |e| e.late_kicks,
        ),
        (
            "anticipated_total",
            MetricType::COUNTER,
            "Times the engine thread waited for an entitled VM's next request and got it.",
            |e| e.anticipated,
        ),
        (
            "poll_window_microseconds",
            MetricType::GAUGE,
            "How long the engine thread polls after work before it parks (adapts to the traffic).",
            |e| e.poll_window_us,
        ),
    ];
    for (name, kind, help, get) in families {
        let mut f = Family::new(out, format!("vhost_user_rdma_engine_{name}"), kind, help);
        for e in engines {
            f.sample(&[("engine", &e.index.to_string())], get(e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_label_values_and_writes_cumulative_seconds() {
        let mut out = Vec::new();
        let mut h = HistogramSnapshot::default();
        h.buckets[0] = 2;
        h.buckets[2] = 1;
        h.buckets[LATENCY_BOUNDS_US.len()] = 1;
        h.count = 4;
        h.sum_ns = 1_500_000_000;
        Family::new(&mut out, "x_seconds", MetricType::HISTOGRAM, "h")
            .histogram(&[("vm", "a\"b\\c\nd")], &h);
        let mut page = String::new();
        TextEncoder::new().encode_utf8(&out, &mut page).unwrap();
        let vm = r#"vm="a\"b\\c\nd""#;
        for (le, n) in [
            ("0.000005", 2),
            ("0.00001", 2),
            ("0.00002", 3),
            ("1", 3),
            ("+Inf", 4),
        ] {
            let line = format!("x_seconds_bucket{{{vm},le=\"{le}\"}} {n}\n");
            assert!(page.contains(&line), "{line} in {page}");
        }
        assert!(
            page.contains(&format!("x_seconds_sum{{{vm}}} 1.5\n")),
            "{page}"
        );
        assert!(
            page.contains(&format!("x_seconds_count{{{vm}}} 4\n")),
            "{page}"
        );
        assert!(page.starts_with("# HELP x_seconds h\n# TYPE x_seconds histogram\n"));
    }
}
