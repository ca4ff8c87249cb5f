//! Trn2 UltraServers: 4 trn2u nodes joined by NeuronLink, used as sets of
//! 1, 2 or 4 nodes.
//!
//! The kernel driver elects the node's place in its UltraServer over
//! NeuronLink and shows the result in class-level files of
//! `/sys/class/neuron_device/` (world-readable):
//! - `ultraserver_mode`: the modes the node supports, as the kernel's mode
//!   numbers, comma-separated (`1,2,3,4`); an empty line off UltraServers;
//! - `server_id_2`, `server_id_4`: 16 hex digits naming the 2-node and the
//!   4-node set (all zeros off UltraServers and while the election runs);
//! - `node_id_2` (0..1), `node_id_4` (0..3): the node's place in each set
//!   (`-1` off UltraServers).
//!
//! While the election runs, `node_id_N` and `ultraserver_mode` read `busy`.
//! Then nothing is published: a wrong id would put the pods of one workload
//! on two UltraServers, so [`read`] says [`UltraServer::Electing`] and the
//! next rescan (uevent or the periodic one) reads again. An id that does not
//! parse, or ids that contradict each other (a node id without a server id),
//! are treated the same way, with the reason.
//!
//! Mode numbers (the kernel's and the Neuron runtime's enum): X4 = 1 (4
//! nodes), X2H = 2 (2 nodes, horizontal pair), X2V = 3 (2 nodes, vertical
//! pair), X1 = 4 (1 node). A claim asks in nodes (`UltraServerConfig
//! {ultraserverMode: 1|2|4}`); the container gets the runtime's enum in
//! `NEURON_RT_ULTRASERVER_MODE`: 4 nodes → 1, 2 nodes → 3 when X2V is
//! supported (the pairing `server_id_2` follows then), else 2, 1 node → 4.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use topology::sysfs::read_attr;

/// The kernel's UltraServer mode numbers.
pub const MODE_X4: u32 = 1;
pub const MODE_X2H: u32 = 2;
pub const MODE_X2V: u32 = 3;
pub const MODE_X1: u32 = 4;

/// Node labels AWS documents for UltraServer nodes (LeaderWorkerSet's
/// `exclusive-topology` keys on the server ids).
pub const LABEL_MODE: &str = "neuron.amazonaws.com/ultraserver-mode";
pub const LABEL_SERVER_ID_2: &str = "neuron.amazonaws.com/ultraserver-server-id-2";
pub const LABEL_SERVER_ID_4: &str = "neuron.amazonaws.com/ultraserver-server-id-4";
pub const LABEL_NODE_ID_2: &str = "neuron.amazonaws.com/ultraserver-node-id-2";
pub const LABEL_NODE_ID_4: &str = "neuron.amazonaws.com/ultraserver-node-id-4";
/// Every Node label this driver manages (sets, or removes when the node is
/// not, or not yet, a member of an UltraServer).
pub const NODE_LABELS: &[&str] = &[
    LABEL_MODE,
    LABEL_SERVER_ID_2,
    LABEL_SERVER_ID_4,
    LABEL_NODE_ID_2,
    LABEL_NODE_ID_4,
];

/// Environment variables the Neuron runtime reads on UltraServers.
pub const ENV_MODE: &str = "NEURON_RT_ULTRASERVER_MODE";
pub const ENV_SERVER_ID: &str = "NEURON_RT_ULTRASERVER_SERVER_ID";
pub const ENV_NODE_ID: &str = "NEURON_RT_ULTRASERVER_NODE_ID";
pub const ENV_GLOBAL_TOPOID: &str = "NEURON_GLOBAL_TOPOID";

/// The node's place in its UltraServer, as the election left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// Supported mode numbers (`ultraserver_mode`), never empty.
    pub modes: BTreeSet<u32>,
    /// 16 hex digits.
    pub server_id_2: String,
    pub server_id_4: String,
    pub node_id_2: u32,
    pub node_id_4: u32,
}

/// What the class-level files say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum UltraServer {
    /// Not an UltraServer node (the files are absent, or hold the kernel's
    /// "not an UltraServer" values).
    #[default]
    None,
    /// No usable answer yet: the election runs (`busy`), or the files
    /// contradict each other. Nothing is published until it settles.
    Electing { reason: String },
    /// A member, with its ids.
    Member(Membership),
}

impl UltraServer {
    pub fn membership(&self) -> Option<&Membership> {
        match self {
            UltraServer::Member(m) => Some(m),
            _ => None,
        }
    }
}

/// The files, as read (`None`: absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Files {
    pub ultraserver_mode: Option<String>,
    pub server_id_2: Option<String>,
    pub server_id_4: Option<String>,
    pub node_id_2: Option<String>,
    pub node_id_4: Option<String>,
}

/// Reads the class-level files of `class` (`<sysfs>/class/neuron_device`).
/// A file that cannot be read counts as absent, with a warning.
pub fn read_files(class: &Path) -> Files {
    let read = |name: &str| match read_attr(class.join(name)) {
        Ok(v) => v,
        Err(error) => {
            tracing::warn!(%error, file = name, "UltraServer file unreadable");
            None
        }
    };
    Files {
        ultraserver_mode: read("ultraserver_mode"),
        server_id_2: read("server_id_2"),
        server_id_4: read("server_id_4"),
        node_id_2: read("node_id_2"),
        node_id_4: read("node_id_4"),
    }
}

/// Reads and interprets the class-level files.
pub fn read(class: &Path) -> UltraServer {
    interpret(&read_files(class))
}

fn is_zero_id(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b == b'0')
}

fn parse_server_id(s: &str) -> Option<String> {
    (s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()) && !is_zero_id(s))
        .then(|| s.to_ascii_lowercase())
}

/// What the files mean (pure, for tests).
pub fn interpret(files: &Files) -> UltraServer {
    let trimmed = |v: &Option<String>| v.as_deref().map(str::trim).map(str::to_owned);
    let mode = trimmed(&files.ultraserver_mode);
    let (s2, s4) = (trimmed(&files.server_id_2), trimmed(&files.server_id_4));
    let (n2, n4) = (trimmed(&files.node_id_2), trimmed(&files.node_id_4));
    // An older kernel driver has none of the files.
    let Some(mode) = mode else {
        return UltraServer::None;
    };
    let busy = |v: &Option<String>| v.as_deref() == Some("busy");
    if mode == "busy" || busy(&n2) || busy(&n4) {
        return UltraServer::Electing {
            reason: "the NeuronLink election is running (ultraserver_mode or node_id_N reads busy)"
                .into(),
        };
    }
    if mode.is_empty() {
        return UltraServer::None;
    }
    let electing = |reason: String| UltraServer::Electing { reason };
    let mut modes = BTreeSet::new();
    for part in mode.split(',') {
        match part.trim().parse::<u32>() {
            Ok(m) if (MODE_X4..=MODE_X1).contains(&m) => {
                modes.insert(m);
            }
            _ => {
                return electing(format!(
                    "ultraserver_mode {mode:?} is not a list of modes 1-4"
                ));
            }
        }
    }
    let server = |name: &str, v: &Option<String>| {
        v.as_deref()
            .and_then(parse_server_id)
            .ok_or_else(|| format!("{name} {v:?} is not a 16-digit non-zero id"))
    };
    let node = |name: &str, v: &Option<String>, max: u32| {
        v.as_deref()
            .and_then(|s| s.parse::<u32>().ok())
            .filter(|n| *n < max)
            .ok_or_else(|| format!("{name} {v:?} is not a node id below {max}"))
    };
    let member = (|| {
        Ok::<_, String>(Membership {
            server_id_2: server("server_id_2", &s2)?,
            server_id_4: server("server_id_4", &s4)?,
            node_id_2: node("node_id_2", &n2, 2)?,
            node_id_4: node("node_id_4", &n4, 4)?,
            modes,
        })
    })();
    match member {
        Ok(m) => UltraServer::Member(m),
        Err(reason) => electing(reason),
    }
}

impl Membership {
    /// The node counts the node supports (1, 2, 4), from its modes.
    pub fn node_counts(&self) -> BTreeSet<u32> {
        self.modes
            .iter()
            .filter_map(|m| match *m {
                MODE_X4 => Some(4),
                MODE_X2H | MODE_X2V => Some(2),
                MODE_X1 => Some(1),
                _ => None,
            })
            .collect()
    }

    /// `1_2_4`: the node counts, as AWS's `ultraserver-mode` label writes them.
    pub fn mode_label(&self) -> String {
        self.node_counts()
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join("_")
    }

    /// The labels of the Node.
    pub fn node_labels(&self) -> BTreeMap<String, String> {
        [
            (LABEL_MODE, self.mode_label()),
            (LABEL_SERVER_ID_2, self.server_id_2.clone()),
            (LABEL_SERVER_ID_4, self.server_id_4.clone()),
            (LABEL_NODE_ID_2, self.node_id_2.to_string()),
            (LABEL_NODE_ID_4, self.node_id_4.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The runtime's variables for a workload of `nodes` nodes, or why the
    /// node cannot run one.
    pub fn runtime_env(&self, nodes: u32) -> Result<BTreeMap<String, String>, ModeError> {
        let supported = self.node_counts();
        if !supported.contains(&nodes) {
            return Err(ModeError {
                requested: nodes,
                supported: supported.into_iter().collect(),
            });
        }
        let (mode, server_id, node_id) = match nodes {
            4 => (MODE_X4, self.server_id_4.clone(), self.node_id_4),
            2 => {
                let mode = if self.modes.contains(&MODE_X2V) {
                    MODE_X2V
                } else {
                    MODE_X2H
                };
                (mode, self.server_id_2.clone(), self.node_id_2)
            }
            // One node: the whole set is this node.
            _ => (MODE_X1, self.server_id_4.clone(), 0),
        };
        Ok([
            (ENV_MODE, mode.to_string()),
            (ENV_SERVER_ID, server_id),
            (ENV_NODE_ID, node_id.to_string()),
            (ENV_GLOBAL_TOPOID, node_id.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect())
    }
}

/// A workload size the node does not support.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ModeError {
    pub requested: u32,
    pub supported: Vec<u32>,
}

impl fmt::Display for ModeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let supported = self
            .supported
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        write!(
            f,
            "UltraServerConfig ultraserverMode {n}: a set of {n} node{s} is not supported on \
             this node; supported here: {supported} (from \
             /sys/class/neuron_device/ultraserver_mode); ask for one of those, or schedule the \
             claim on nodes that support it (node label {LABEL_MODE})",
            n = self.requested,
            s = if self.requested == 1 { "" } else { "s" },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(mode: &str, s2: &str, s4: &str, n2: &str, n4: &str) -> Files {
        let f = |s: &str| Some(format!("{s}\n"));
        Files {
            ultraserver_mode: f(mode),
            server_id_2: f(s2),
            server_id_4: f(s4),
            node_id_2: f(n2),
            node_id_4: f(n4),
        }
    }

    const S2: &str = "5e0d7a1c00000002";
    const S4: &str = "5e0d7a1c00000004";
    const ZERO: &str = "0000000000000000";

    #[test]
    fn the_kernels_three_forms() {
        assert_eq!(interpret(&Files::default()), UltraServer::None);
        assert_eq!(
            interpret(&files("", ZERO, ZERO, "-1", "-1")),
            UltraServer::None
        );
        assert!(matches!(
            interpret(&files("busy", ZERO, ZERO, "busy", "busy")),
            UltraServer::Electing { .. }
        ));
        let UltraServer::Member(m) = interpret(&files("1,2,3,4", S2, S4, "1", "3")) else {
            panic!("member expected")
        };
        assert_eq!(m.node_id_2, 1);
        assert_eq!(m.node_id_4, 3);
        assert_eq!(m.mode_label(), "1_2_4");
        assert_eq!(m.node_labels()[LABEL_SERVER_ID_4], S4);
        assert_eq!(m.node_labels()[LABEL_NODE_ID_2], "1");
    }

    #[test]
    fn contradictions_are_not_published() {
        for (case, f) in [
            ("zero server id", files("1,4", ZERO, S4, "0", "0")),
            ("node id out of range", files("1,4", S2, S4, "2", "0")),
            ("short id", files("1,4", "abc", S4, "0", "0")),
            ("mode 7", files("1,7", S2, S4, "0", "0")),
            ("node id -1 with modes", files("1,2,3,4", S2, S4, "-1", "0")),
            ("one node id busy", files("1,2,3,4", S2, S4, "0", "busy")),
        ] {
            assert!(
                matches!(interpret(&f), UltraServer::Electing { .. }),
                "{case}: {:?}",
                interpret(&f)
            );
        }
    }

    #[test]
    fn runtime_env_per_size() {
        let UltraServer::Member(m) = interpret(&files("1,2,3,4", S2, S4, "1", "2")) else {
            panic!()
        };
        let env = m.runtime_env(4).unwrap();
        assert_eq!(env[ENV_MODE], "1");
        assert_eq!(env[ENV_SERVER_ID], S4);
        assert_eq!(env[ENV_NODE_ID], "2");
        assert_eq!(env[ENV_GLOBAL_TOPOID], "2");
        let env = m.runtime_env(2).unwrap();
        assert_eq!(env[ENV_MODE], "3", "X2V when supported");
        assert_eq!(env[ENV_SERVER_ID], S2);
        assert_eq!(env[ENV_NODE_ID], "1");
        let env = m.runtime_env(1).unwrap();
        assert_eq!(
            (env[ENV_MODE].as_str(), env[ENV_NODE_ID].as_str()),
            ("4", "0")
        );

        let UltraServer::Member(h) = interpret(&files("1,2,4", S2, S4, "0", "0")) else {
            panic!()
        };
        assert_eq!(h.runtime_env(2).unwrap()[ENV_MODE], "2", "X2H without X2V");

        let UltraServer::Member(x4) = interpret(&files("1", S2, S4, "0", "0")) else {
            panic!()
        };
        let err = x4.runtime_env(2).unwrap_err().to_string();
        assert!(
            err.contains("a set of 2 nodes is not supported") && err.contains("supported here: 4"),
            "{err}"
        );
    }
}
