//! Where the time of a step goes, by category (`plexus bench --profile`): on a GPU, the kernels
//! CUPTI saw (device time, and launches); on the CPU, the leaf operators that do work (the proxy
//! of kernels, see [`crate::native::profile::OpCount`]).
//!
//! A kernel or an operator is put in a category by, in this order:
//! 1. the innermost plexus scope it ran under ([`crate::native::kineto::scope`]): the topology's own code
//!    (between units), RoPE, the loss, the optimizer; a unit's scope hands it to the rules below.
//!    A backward operator runs under no scope: it takes the scope of the forward operator that
//!    made its autograd node (same sequence number, on the forward's thread);
//! 2. the names of the operators that asked for it, outermost first (`aten::linear` → GEMM,
//!    `aten::scaled_dot_product_attention` → attention, `aten::layer_norm` → norm, …; the
//!    backward nodes' names too, `NativeLayerNormBackward0` → norm);
//! 3. on a GPU, the kernel's own name (`…gemm…`, `flash_fwd…`, `direct_copy_kernel`, …);
//! 4. else "other" (elementwise arithmetic of the backbone: residual adds, gates, scalings).

use crate::native::{kineto::EventKind, kineto::ProfileEvent};
use std::collections::HashMap;

/// The categories, in the order they are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    Gemm,
    Attention,
    Norm,
    Activation,
    Rope,
    Loss,
    CastCopy,
    Optimizer,
    TopologyOwn,
    Other,
}

impl Category {
    pub const ALL: [Category; 10] = [
        Category::Gemm,
        Category::Attention,
        Category::Norm,
        Category::Activation,
        Category::Rope,
        Category::Loss,
        Category::CastCopy,
        Category::Optimizer,
        Category::TopologyOwn,
        Category::Other,
    ];

    /// The category's name in the profile's table and CSV.
    pub fn name(self) -> &'static str {
        match self {
            Category::Gemm => "GEMM",
            Category::Attention => "attention",
            Category::Norm => "norm",
            Category::Activation => "activation",
            Category::Rope => "RoPE",
            Category::Loss => "loss",
            Category::CastCopy => "cast/copy",
            Category::Optimizer => "optimizer",
            Category::TopologyOwn => "topology-own",
            Category::Other => "other",
        }
    }
}

/// What a plexus scope ([`crate::native::kineto::scopes`]) decides: `Some(Some(c))` a category, `Some(None)`
/// a unit's scope (the names decide), `None` not a plexus scope.
fn scope_category(name: &str) -> Option<Option<Category>> {
    use crate::native::kineto::scopes;
    let is = |c: &std::ffi::CStr| c.to_str().is_ok_and(|s| s == name);
    if is(scopes::TOPOLOGY) {
        Some(Some(Category::TopologyOwn))
    } else if is(scopes::ROPE) {
        Some(Some(Category::Rope))
    } else if is(scopes::LOSS) {
        Some(Some(Category::Loss))
    } else if is(scopes::OPTIMIZER) {
        Some(Some(Category::Optimizer))
    } else if is(scopes::UNIT) {
        Some(None)
    } else {
        None
    }
}

/// The category an operator's or a kernel's name says, if any.
pub fn category_of_name(name: &str) -> Option<Category> {
    let n = name.to_ascii_lowercase();
    let any = |keys: &[&str]| keys.iter().any(|k| n.contains(k));
    if any(&["attention", "flash", "fmha", "sdpa"]) {
        Some(Category::Attention)
    } else if any(&[
        "layer_norm",
        "layernorm",
        "rms_norm",
        "rmsnorm",
        "batch_norm",
        "group_norm",
        "plexus::norm",
        "plexus_norm",
    ]) {
        Some(Category::Norm)
    } else if any(&["plexus::rope", "plexus_rope", "rotary"]) {
        Some(Category::Rope)
    } else if any(&["cross_entropy", "nll_loss", "mse_loss", "log_softmax", "logsoftmax"]) {
        Some(Category::Loss)
    } else if any(&["adam", "multi_tensor_apply", "_foreach_"]) {
        Some(Category::Optimizer)
    } else if any(&[
        "gemm",
        "aten::mm",
        "aten::bmm",
        "addmm",
        "baddbmm",
        "matmul",
        "aten::linear",
        "einsum",
        "cutlass",
        "xmma",
        "cublas",
        "nvjet",
        "convolution",
        "conv2d",
        "mmbackward",
        "bmmbackward",
    ]) {
        Some(Category::Gemm)
    } else if any(&["gelu", "silu", "relu", "tanh", "sigmoid", "softplus", "glu"]) {
        Some(Category::Activation)
    } else if any(&["copy", "aten::to", "aten::cat", "aten::clone", "contiguous", "catarraybatched", "fill"]) {
        Some(Category::CastCopy)
    } else {
        None
    }
}

/// One category's share of the profiled step.
#[derive(Debug, Clone, PartialEq)]
pub struct CategoryTime {
    pub category: Category,
    pub ms: f64,
    /// The part of `ms` in the backward pass (under an autograd node).
    pub backward_ms: f64,
    /// Kernels launched (GPU) or working leaf operators run (CPU).
    pub launches: u64,
}

/// Time by category of one profiled step.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelProfile {
    /// GPU kernel time (true) or CPU operator time (false).
    pub gpu: bool,
    /// Every category, in [`Category::ALL`] order (zeros included).
    pub rows: Vec<CategoryTime>,
}

impl KernelProfile {
    /// The step's time over all categories, in ms.
    pub fn total_ms(&self) -> f64 {
        self.rows.iter().map(|r| r.ms).sum()
    }

    /// Kernels launched (GPU) or working leaf operators run (CPU) over all categories.
    pub fn launches(&self) -> u64 {
        self.rows.iter().map(|r| r.launches).sum()
    }

    /// The row of category `c` (every category has one, zero if nothing ran in it).
    pub fn get(&self, c: Category) -> &CategoryTime {
        self.rows.iter().find(|r| r.category == c).expect("every category has a row")
    }

    /// The table `plexus bench --profile` prints.
    pub fn table(&self) -> String {
        let (what, count) = if self.gpu { ("GPU kernel time", "kernels") } else { ("CPU operator time", "operators") };
        let total = self.total_ms();
        if self.gpu && self.launches() == 0 {
            return format!(
                "{what} of one step: no kernel was recorded (libtorch's profiler found no CUPTI: the \
                 nvidia-cuda-cupti package of the CUDA version, next to the torch wheel)\n"
            );
        }
        let mut out = format!(
            "{what} of one step, by category:\n  {:<13} {:>9} {:>7} {:>12} {:>9}\n",
            "", "ms", "share", "backward ms", count
        );
        for r in self.rows.iter().filter(|r| r.launches > 0) {
            let share = if total > 0.0 { 100.0 * r.ms / total } else { 0.0 };
            out += &format!(
                "  {:<13} {:>9.3} {:>6.1}% {:>12.3} {:>9}\n",
                r.category.name(),
                r.ms,
                share,
                r.backward_ms,
                r.launches
            );
        }
        let backward: f64 = self.rows.iter().map(|r| r.backward_ms).sum();
        out += &format!("  {:<13} {:>9.3} {:>6.1}% {:>12.3} {:>9}\n", "total", total, 100.0, backward, self.launches());
        out
    }
}

/// Sorts the events of a profile into categories (see the module doc). `gpu`: count the device's
/// kernels, copies and fills; else the host's working leaf operators.
pub fn categorize(events: &[ProfileEvent], gpu: bool) -> KernelProfile {
    let tree = EventTree::new(events);
    let mut rows: HashMap<Category, CategoryTime> = Category::ALL
        .iter()
        .map(|&c| (c, CategoryTime { category: c, ms: 0.0, backward_ms: 0.0, launches: 0 }))
        .collect();
    let mut add = |c: Category, ns: u64, backward: bool| {
        let r = rows.get_mut(&c).expect("every category");
        r.ms += ns as f64 / 1e6;
        if backward {
            r.backward_ms += ns as f64 / 1e6;
        }
        r.launches += 1;
    };
    if gpu {
        tree.gpu_work(&mut add);
    } else {
        tree.cpu_work(&mut add);
    }
    KernelProfile { gpu, rows: Category::ALL.iter().map(|c| rows[c].clone()).collect() }
}

/// The records of autograd nodes themselves (`MulBackward0`, `torch::autograd::AccumulateGrad`,
/// `…CppNode<…>`): what runs inside them is counted, not they.
fn node_record(e: &ProfileEvent) -> bool {
    e.name.starts_with("torch::autograd::") || (!e.name.contains("::") && e.name.contains("Backward"))
}

fn is_backward_node(e: &ProfileEvent) -> bool {
    e.name.starts_with("autograd::engine::evaluate_function")
}

/// A profile's host events as a tree (each one's innermost enclosing host event, per thread),
/// with the forward operator behind each autograd node.
struct EventTree<'a> {
    events: &'a [ProfileEvent],
    parent: Vec<Option<usize>>,
    /// Whether an operator calls another that does work (not a view or an allocation).
    has_child: Vec<bool>,
    /// Forward operators by thread and sequence number: of those with one number, the last to
    /// start made the autograd node (views before it peek the same number).
    forward: HashMap<u64, std::collections::BTreeMap<i64, usize>>,
}

impl<'a> EventTree<'a> {
    fn new(events: &'a [ProfileEvent]) -> Self {
        let host = |e: &ProfileEvent| matches!(e.kind, EventKind::Op | EventKind::Scope | EventKind::Launch);
        // A sweep over each thread's host events sorted by start (longer first on a tie), with a
        // stack of the open ones.
        let mut parent: Vec<Option<usize>> = vec![None; events.len()];
        let mut has_child = vec![false; events.len()];
        let mut by_thread: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, e) in events.iter().enumerate().filter(|(_, e)| host(e)) {
            by_thread.entry(e.thread).or_default().push(i);
        }
        for ids in by_thread.values_mut() {
            ids.sort_by_key(|&i| (events[i].start_ns, std::cmp::Reverse(events[i].duration_ns)));
            let mut open: Vec<usize> = Vec::new();
            for &i in ids.iter() {
                while open.last().is_some_and(|&j| {
                    events[j].end_ns() < events[i].end_ns() || events[j].end_ns() <= events[i].start_ns
                }) {
                    open.pop();
                }
                if let Some(&j) = open.last() {
                    parent[i] = Some(j);
                    if events[i].kind == EventKind::Op && !crate::native::kineto::is_metadata_op(&events[i].name) {
                        has_child[j] = true;
                    }
                }
                open.push(i);
            }
        }
        // Backward records (a node's own, `MulBackward0`, carries its forward's number too) have
        // a forward thread; forward ones have none.
        let mut forward: HashMap<u64, std::collections::BTreeMap<i64, usize>> = HashMap::new();
        for (i, e) in events.iter().enumerate() {
            if e.kind == EventKind::Op
                && e.sequence_nr >= 0
                && e.forward_thread == 0
                && !node_record(e)
                && !is_backward_node(e)
            {
                let slot = forward.entry(e.thread).or_default().entry(e.sequence_nr).or_insert(i);
                if events[*slot].start_ns <= e.start_ns {
                    *slot = i;
                }
            }
        }
        EventTree { events, parent, has_child, forward }
    }

    /// The enclosing events of `i`, innermost first (`i` itself included when `with_self`).
    fn ancestors(&self, i: usize, with_self: bool) -> impl Iterator<Item = usize> + '_ {
        let first = if with_self { Some(i) } else { self.parent[i] };
        std::iter::successors(first, |&j| self.parent[j])
    }

    /// The forward operator behind a backward node: the one with its number, else the nearest
    /// before it (a custom autograd function's forward records no operator of its own: the
    /// operators just before it are in the same code).
    fn forward_of(&self, node: &ProfileEvent) -> Option<usize> {
        self.forward.get(&node.forward_thread).and_then(|m| m.range(..=node.sequence_nr).next_back()).map(|(_, &i)| i)
    }

    /// The category of host event `i` and what it ran under.
    fn classify(&self, i: usize) -> Option<Category> {
        let mut names: Vec<&str> = Vec::new(); // innermost first
        for j in self.ancestors(i, true) {
            let e = &self.events[j];
            if e.kind == EventKind::Scope {
                if let Some(scoped) = scope_category(&e.name) {
                    if scoped.is_some() {
                        return scoped;
                    }
                    break; // a unit: the names decide
                }
            }
            if e.kind == EventKind::Op {
                names.push(&e.name);
                if is_backward_node(e) {
                    // The scope of the forward operator that made this node, if it had one that
                    // decides; else the names so far.
                    if let Some(c) = self.forward_of(e).and_then(|f| scope_of(self.events, &self.parent, f)) {
                        return Some(c);
                    }
                    break;
                }
            }
        }
        names.iter().rev().find_map(|n| category_of_name(n))
    }

    /// Whether host event `i` runs in the backward pass (under an autograd node).
    fn in_backward(&self, i: usize) -> bool {
        self.ancestors(i, true).any(|j| is_backward_node(&self.events[j]))
    }

    /// Each GPU kernel, copy and fill, in the category of its operator: the one it is linked to
    /// (as torch.profiler pairs them), else the one around its runtime call on the host.
    fn gpu_work(&self, add: &mut impl FnMut(Category, u64, bool)) {
        let by_correlation = |kind: EventKind| -> HashMap<u64, usize> {
            self.events
                .iter()
                .enumerate()
                .filter(|(_, e)| e.kind == kind && e.correlation != 0)
                .map(|(i, e)| (e.correlation, i))
                .collect()
        };
        let (ops, launches) = (by_correlation(EventKind::Op), by_correlation(EventKind::Launch));
        let device = |e: &&ProfileEvent| matches!(e.kind, EventKind::Kernel | EventKind::Memcpy | EventKind::Memset);
        for e in self.events.iter().filter(device) {
            let host = (e.linked != 0).then(|| ops.get(&e.linked)).flatten().or_else(|| launches.get(&e.correlation));
            let by_host = host.and_then(|&i| self.classify(i));
            let by_kernel = match e.kind {
                EventKind::Kernel => category_of_name(&e.name),
                _ => Some(Category::CastCopy),
            };
            let backward = host.is_some_and(|&i| self.in_backward(i));
            add(by_host.or(by_kernel).unwrap_or(Category::Other), e.duration_ns, backward);
        }
    }

    /// What would be one kernel on a GPU: a product or an attention operator whole (what it
    /// calls on the CPU — packing, zero-filling — is its own business), else an operator that
    /// calls no other working one. Not: views and allocations, and the records of autograd nodes
    /// that only pass gradients on (`AddBackward0` with nothing inside).
    fn cpu_work(&self, add: &mut impl FnMut(Category, u64, bool)) {
        let whole = |e: &ProfileEvent| {
            e.kind == EventKind::Op
                && !is_backward_node(e)
                && !node_record(e)
                && matches!(category_of_name(&e.name), Some(Category::Gemm | Category::Attention))
        };
        for (i, e) in self.events.iter().enumerate() {
            let counted = e.kind == EventKind::Op
                && (whole(e) || !self.has_child[i])
                && !is_backward_node(e)
                && !node_record(e)
                && !crate::native::kineto::is_metadata_op(&e.name)
                && !self.ancestors(i, false).any(|j| whole(&self.events[j]));
            if counted {
                add(self.classify(i).unwrap_or(Category::Other), e.duration_ns, self.in_backward(i));
            }
        }
    }
}

/// The category a plexus scope around host event `i` decides (topology, RoPE, loss, optimizer),
/// if any.
fn scope_of(events: &[ProfileEvent], parent: &[Option<usize>], i: usize) -> Option<Category> {
    let mut at = parent[i];
    while let Some(j) = at {
        if events[j].kind == EventKind::Scope {
            if let Some(scoped) = scope_category(&events[j].name) {
                return scoped;
            }
        }
        at = parent[j];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: EventKind, name: &str, thread: u64, start: u64, dur: u64) -> ProfileEvent {
        ProfileEvent {
            kind,
            name: name.into(),
            thread,
            start_ns: start,
            duration_ns: dur,
            correlation: 0,
            linked: 0,
            sequence_nr: -1,
            forward_thread: 0,
        }
    }

    /// Nesting, scopes, backward attribution through sequence numbers, and kernels through their
    /// launches, on a hand-made trace.
    #[test]
    fn events_are_sorted_into_categories() {
        use EventKind::*;
        let mut e = vec![
            ev(Scope, "plexus::topology", 1, 0, 1000),
            ev(Op, "aten::mul", 1, 10, 20), // topology's own
            ev(Scope, "plexus::unit", 1, 100, 500),
            ev(Op, "aten::linear", 1, 110, 100),
            ev(Op, "aten::addmm", 1, 120, 80), // inside the linear, counted with it
            ev(Op, "aten::add", 1, 300, 10),   // a unit's elementwise: other
            ev(Scope, "plexus::rope", 1, 400, 50),
            ev(Op, "aten::neg", 1, 410, 5),  // RoPE
            ev(Op, "aten::view", 1, 420, 1), // metadata: not counted
            // backward, on thread 2: the node of the topology's mul (sequence 7)
            ev(Op, "autograd::engine::evaluate_function: MulBackward0", 2, 2000, 50),
            ev(Op, "aten::mul", 2, 2010, 30),
            // the node of the addmm (sequence 8): by its names, GEMM
            ev(Op, "autograd::engine::evaluate_function: AddmmBackward0", 2, 2100, 50),
            ev(Op, "aten::mm", 2, 2110, 30),
        ];
        e[1].sequence_nr = 7;
        e[4].sequence_nr = 8;
        e[3].sequence_nr = 8;
        for (i, fwd) in [(9, 7), (11, 8)] {
            e[i].sequence_nr = fwd;
            e[i].forward_thread = 1;
        }
        let p = categorize(&e, false);
        let ms = |c| p.get(c).ms * 1e6;
        assert_eq!((ms(Category::TopologyOwn), p.get(Category::TopologyOwn).launches), (20.0 + 30.0, 2));
        assert_eq!(p.get(Category::TopologyOwn).backward_ms * 1e6, 30.0);
        // The product whole (linear, not the addmm inside), and the backward's mm.
        assert!((ms(Category::Gemm) - (100.0 + 30.0)).abs() < 1e-6, "{}", ms(Category::Gemm));
        assert_eq!(ms(Category::Other), 10.0);
        assert_eq!(ms(Category::Rope), 5.0);
        assert_eq!(p.launches(), 6);
        // On a GPU: kernels by their launch's host context, else by their own name.
        let mut g = e.clone();
        let mut launch = ev(Launch, "cudaLaunchKernel", 1, 130, 5);
        launch.correlation = 42;
        g.push(launch);
        let mut k = ev(Kernel, "sm90_xmma_gemm_bf16", 99, 5000, 700);
        k.correlation = 42;
        g.push(k);
        let mut orphan = ev(Kernel, "vectorized_elementwise_kernel<gelu>", 99, 6000, 300);
        orphan.correlation = 43;
        g.push(orphan);
        g.push(ev(Memcpy, "Memcpy DtoD", 99, 7000, 100));
        // Linked to the RoPE's neg (operator correlation 5): RoPE, whatever its name says.
        g[7].correlation = 5;
        let mut linked = ev(Kernel, "vectorized_elementwise_kernel<neg>", 99, 8000, 40);
        linked.linked = 5;
        g.push(linked);
        let p = categorize(&g, true);
        assert_eq!(p.get(Category::Gemm).ms * 1e6, 700.0);
        assert_eq!(p.get(Category::Activation).ms * 1e6, 300.0);
        assert_eq!(p.get(Category::CastCopy).ms * 1e6, 100.0);
        assert_eq!(p.get(Category::Rope).ms * 1e6, 40.0);
        assert_eq!(p.launches(), 4);
        assert!(p.table().contains("GEMM"), "{}", p.table());
    }

    #[test]
    fn names_say_their_category() {
        for (name, c) in [
            ("aten::scaled_dot_product_attention", Category::Attention),
            ("ScaledDotProductFlashAttentionForCpuBackward0", Category::Attention),
            ("NativeLayerNormBackward0", Category::Norm),
            ("aten::native_layer_norm", Category::Norm),
            ("aten::cross_entropy_loss", Category::Loss),
            ("aten::_fused_adamw_", Category::Optimizer),
            ("aten::addmm", Category::Gemm),
            ("aten::gelu_backward", Category::Activation),
            ("aten::_to_copy", Category::CastCopy),
            ("void at::native::direct_copy_kernel_cuda", Category::CastCopy),
            // plexus' own kernels: their operator names (the CPU, PLEXUS_FUSED_KERNELS=cuda-host)
            // and their CUDA kernels' names.
            ("plexus::norm_bf16_backward", Category::Norm),
            ("plexus_norm_forward_bf16", Category::Norm),
            ("plexus::rope_heads_backward", Category::Rope),
            ("plexus_rope_backward_bf16", Category::Rope),
            ("plexus::swiglu", Category::Activation),
            ("plexus_swiglu_backward_bf16", Category::Activation),
            ("plexus::cross_entropy_backward", Category::Loss),
            ("plexus_cross_entropy_forward_bf16", Category::Loss),
        ] {
            assert_eq!(category_of_name(name), Some(c), "{name}");
        }
        assert_eq!(category_of_name("aten::add"), None);
    }
}
