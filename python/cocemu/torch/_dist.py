"""The `cocemu` backend of torch.distributed: a ProcessGroup per rank thread and group.

torch.distributed's own functions (all_reduce, new_group, get_rank, the object collectives …)
call this ProcessGroup's methods, as C++ does (DDP's Reducer). Collectives run on cocemu's group
comm streams with ProcessGroupNCCL/HCCL semantics: the comm stream waits for the caller's current
stream; `Work.wait()` makes the current stream wait for the collective (modeled; the host does not
block in modeled time). Torch ops run on the host thread (cocemu.torch._mode prices them on the
current stream), so `Work.wait()` also waits in wall time until the data is there; reading an
async collective's output before its `wait()` is reported (checked mode).
"""
import contextlib

import numpy as np
import torch

import cocemu

from . import _args, _races, _state, _torch2
from ._state import error

DTYPES = {
    torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16",
    torch.int8: "i8", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
    torch.bool: "bool",
}
COMPLEX = {torch.complex64: torch.float32, torch.complex128: torch.float64}


class Work(_torch2.WorkBase):
    """torch.distributed's Work for a cocemu collective: wait(), is_completed(), get_future(),
    exception(). `cw` is cocemu's Work, or a _Batch whose ops are not launched yet."""

    def __init__(self, st, cw, call, group, outputs=(), finish=None, inputs=(), result=None):
        super().__init__()
        self._st, self._cw, self._call, self._group = st, cw, call, group
        self._finish, self._done, self._error = finish, False, None
        self._result = list(outputs if result is None else result)
        self._source = -1
        self._regions = []
        if st.checked and st.numerics:  # until wait(): outputs untouchable, inputs unwritable
            for tensors, is_output in ((outputs, True), (inputs, False)):
                for t in tensors:
                    if t is not None and t.device.type == "cpu" and t.numel() > 0 and \
                            t.layout == torch.strided:
                        start = t.data_ptr()
                        self._regions.append(
                            (start, start + t.numel() * t.element_size(), self, is_output))
            st.pending.extend(self._regions)
        # Stream races (checked mode): the collective runs on the group's comm stream after
        # the current stream, reading its inputs and writing its outputs.
        self._race = _races.collective(st, group.cg.stream, call,
                                       [t for t in inputs if t is not None],
                                       [t for t in outputs if t is not None])

    def describe(self):
        return f"{self._call} on {self._group.describe()}"

    def _complete(self):
        if self._done:
            return
        self._done = True
        if self._regions:
            self._st.pending = [p for p in self._st.pending if p[2] is not self]
            self._regions = []  # they name this Work: drop the cycle, free the tensors now
        if self._finish is not None:
            self._finish()
            self._finish = None

    def _data_ready(self):
        """The host waits in wall time (no modeled op) until the outputs hold the result."""
        if self._st.numerics:
            _wait_data(self._st, self._cw)

    def _guard(self, fn):
        try:
            return fn()
        except BaseException as e:
            self._error = e
            raise

    def wait(self, timeout=None):
        """The current stream waits for the collective (the host does not, in modeled time)."""
        if not self._done:
            _races.work_wait(self._st, self._race)

            def body():
                self._cw.wait()
                self._data_ready()
                self._complete()
            try:
                self._guard(body)
            finally:
                if self._st.process is not None:
                    self._st.process.release()
        return True

    def synchronize(self):
        """The host blocks until the collective has finished (a modeled host wait)."""
        _races.work_synchronize(self._st, self._race)
        self._guard(self._cw.synchronize)
        self._complete()

    def is_completed(self):
        return self._done or bool(self._cw.is_completed())

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def _source_rank(self):
        return self._source

    def source_rank(self):
        return self._source

    def result(self):
        return self._result

    def get_future(self):
        """A completed torch Future of the outputs. The host waits in wall time for the data;
        the current stream waits for the collective now or, inside a backward pass (DDP's
        buckets), when the backward pass ends, so the buckets overlap the rest of backward."""
        if not self._done:
            if _torch2.in_backward():
                # The future's callbacks (DDP's comm hook, the bucket's copies) are ordered after
                # the collective, as ProcessGroupNCCL's future callbacks run on a stream that
                # waits for it; the modeled wait of the compute stream comes at the end of the
                # backward pass.
                _races.work_wait(self._st, self._race)
                self._guard(self._data_ready)
                cw = self._cw
                _torch2.after_backward(cw.wait)
                self._complete()
            else:
                self.wait()
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut

    def __repr__(self):
        return f"cocemu.torch.Work({self.describe()})"


class _Batch:
    """p2p ops gathered (batch_isend_irecv, or a coalescing block) and launched as one cocemu
    batch_isend_irecv; stands in for cocemu's Work until launched."""

    def __init__(self, pg, expected):
        self.pg, self.expected, self.ops, self.cw = pg, expected, [], None

    def add(self, op):
        self.ops.append(op)
        if self.expected is not None and len(self.ops) == self.expected:
            self.launch()

    def launch(self):
        if self.cw is None and self.ops:
            self.cw = self.pg._st.api.batch_isend_irecv(self.pg.cg, self.ops)
        return self.cw

    def _launched(self, call):
        if self.launch() is None:
            raise error(f"rank {self.pg._st.id}: batch_isend_irecv: {call} on an empty batch")
        return self.cw

    def wait(self):
        self._launched("wait").wait()

    def synchronize(self):
        self._launched("synchronize").synchronize()

    def is_completed(self):
        return self.cw is not None and self.cw.is_completed()


class _Joined:
    """Several cocemu works as one (coalesced calls made of several collectives)."""

    def __init__(self, works):
        self.works = [w for w in works if w is not None]

    def wait(self):
        for w in self.works:
            w.wait()

    def synchronize(self):
        for w in self.works:
            w.synchronize()

    def is_completed(self):
        return all(w.is_completed() for w in self.works)


def _wait_data(st, cw):
    """Blocks until cocemu Work `cw` (or a _Joined, _Batch) has run, recording nothing."""
    if isinstance(cw, _Joined):
        for w in cw.works:
            _wait_data(st, w)
    elif isinstance(cw, _Batch):
        _wait_data(st, cw._launched("wait"))
    else:
        st.api.wait_unmodeled(cw)


def _mailbox(st):
    """The run's AnySource (one for all its ranks)."""
    return st.shared_object("any_source", "AnySource")


def _check_alive(pg, call):
    st = pg._st
    if st.ended:
        raise error(f"{call} on cocemu group '{pg._cname}' (world ranks {pg.ranks}): the "
                    f"cocemu.torch.run that made this group has ended; a ProcessGroup lives "
                    f"only inside its run (create groups inside fn)")
    if _state.current() is not st:
        raise error(f"{call} on cocemu group '{pg._cname}' of rank {st.id}: called from another "
                    f"thread (a group belongs to the rank thread that created it)")
    return st


class ProcessGroup(_torch2.ProcessGroupBase):
    """The `cocemu` backend's process group over a cocemu group (one object per rank thread)."""

    def __init__(self, st, cg, ranks, name):
        super().__init__(cg.rank, cg.size)
        self._st, self.cg, self.ranks, self._cname = st, cg, list(ranks), name
        self._coalescing = None  # [works] inside _start_coalescing … _end_coalescing
        self._batch = None       # p2p ops gathered while coalescing
        self._name, self._desc = name, "undefined"
        st.groups[self] = self.ranks

    def getBackendName(self):
        return _torch2.BACKEND

    # torch names a group through its backends; this group has none, so it keeps its names
    @property
    def group_name(self):
        return self._name

    @property
    def group_desc(self):
        return self._desc

    def _set_group_name(self, name):
        self._name = name

    def _set_group_desc(self, desc):
        self._desc = desc

    def describe(self):
        return f"group '{self._cname}' (world ranks {self.ranks})"

    def __repr__(self):
        return f"cocemu.torch.ProcessGroup('{self._cname}', rank={self.rank()}, " \
               f"size={self.size()})"

    # --- helpers ------------------------------------------------------------------------------

    @property
    def _api(self):  # cocemu's module on rank threads, the hub's on rank processes
        return self._st.api

    @contextlib.contextmanager
    def _launch(self, opts):
        """Around a collective's launch: when torch waits for it at once (opts.asyncOp False), a
        rank process holds its one-way calls until the wait's (one write to the hub, not three);
        `Work.wait` releases them."""
        process = self._st.process
        hold = (process is not None and self._coalescing is None and opts is not None
                and getattr(opts, "asyncOp", True) is False)
        if hold:
            process.hold()
        try:
            yield
        except BaseException:
            if hold:
                process.release()
            raise

    def _work(self, cw, call, outputs=(), finish=None, inputs=(), result=None):
        w = Work(self._st, cw, call, self, outputs, finish, inputs, result)
        if self._coalescing is not None:
            self._coalescing.append(w)
        return w

    def _root(self, root, call, what):
        if not isinstance(root, int) or not 0 <= root < self.size():
            raise error(f"rank {self._st.id}: {call}: {what} {root!r} is not a rank of "
                        f"{self.describe()} (group ranks 0..{self.size() - 1})")
        return root

    def _arr(self, t, call, what, shape=None):
        return _array(t, self._st, call, what, shape)

    # --- groups -------------------------------------------------------------------------------

    def new_group(self, ranks, timeout=None, pg_options=None, group_name=None, group_desc=None):
        """torch's new_group calls this on the default group on every rank (members or not)."""
        st = _check_alive(self, "new_group")
        cg = self._api.new_group(st.rank, list(ranks))
        if not cg.is_member:
            return None
        pg = ProcessGroup(st, cg, ranks, cg.name)
        if group_name is not None:
            pg._set_group_name(group_name)
        if group_desc is not None:
            pg._set_group_desc(group_desc)
        return pg

    # --- collectives --------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        call = "all_reduce"
        st = _check_alive(self, call)
        op = _op(opts.reduceOp if opts is not None else None, st, call)
        if any(t.is_sparse for t in tensors):
            return self._sparse_allreduce(tensors, op, call)
        with self._launch(opts):
            cws = [self._api.all_reduce(self.cg, self._arr(t, call, "tensor"), op=op,
                                        async_op=True) for t in tensors]
        return self._work(cws[0] if len(cws) == 1 else _Joined(cws), call, tensors)

    def _sparse_allreduce(self, tensors, op, call):
        """A sparse COO tensor's sum over the group (what gloo gives): every rank's indices and
        values all-gathered (padded to the largest count), summed and coalesced, written back
        into the tensor. The host waits for the gathers (the result's size depends on them)."""
        st = self._st
        if op != "sum" or len(tensors) != 1:
            raise error(f"rank {st.id}: {call}: sparse tensors take op SUM and one tensor, got "
                        f"op {op} and {len(tensors)} tensors")
        t = tensors[0]
        if not st.numerics:
            raise error(f"rank {st.id}: {call}: a sparse tensor in a run with numerics=False "
                        f"(its result's size depends on the data)")
        c = t.coalesce()
        idx, val = c.indices(), c.values()
        n = self.size()

        def gather(x):
            out = [torch.empty_like(x) for _ in range(n)]
            self.allgather([out], [x.contiguous()]).wait()
            return out
        counts = [int(k) for k in gather(torch.tensor([idx.shape[1]], dtype=torch.int64))]
        most = max(counts)

        def padded(x):  # nnz along dimension `dim` (indices: 1, values: 0) padded to `most`
            dim = 1 if x is idx else 0
            shape = list(x.shape)
            shape[dim] = most - x.shape[dim]
            return torch.cat([x, torch.zeros(shape, dtype=x.dtype)], dim=dim)
        idxs, vals = gather(padded(idx)), gather(padded(val))
        total = torch.sparse_coo_tensor(
            torch.cat([i[:, :k] for i, k in zip(idxs, counts)], dim=1),
            torch.cat([v[:k] for v, k in zip(vals, counts)]), t.shape).coalesce()
        with torch.no_grad():
            t.copy_(total)
        return self._work(_Joined([]), call, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        call = "all_reduce_coalesced"
        st = _check_alive(self, call)
        op = _op(opts.reduceOp if opts is not None else None, st, call)
        return self._coalesced(call, tensors, tensors, lambda flat: self._api.all_reduce(
            self.cg, self._arr(flat, call, "tensors"), op=op, async_op=True))

    def _coalesced(self, call, tensors, outputs, launch):
        """One collective over the tensors flattened into one buffer (what NCCL's group calls
        move), per dtype; the results are copied back at wait()."""
        if not tensors:
            return self._work(_Joined([]), call)
        groups = {}
        for t in tensors:
            groups.setdefault(t.dtype, []).append(t)
        cws, pairs = [], []
        for dtype, ts in groups.items():
            flat = torch.cat([t.reshape(-1) for t in ts])
            cws.append(launch(flat))
            pairs.append((flat, ts))

        def finish():
            for flat, ts in pairs:
                off = 0
                for t in ts:
                    t.copy_(flat[off:off + t.numel()].view(t.shape))
                    off += t.numel()
        return self._work(_Joined(cws), call, [p[0] for p in pairs], finish, result=outputs)

    def allgather(self, output_tensors, input_tensors, opts=None):
        call = "all_gather"
        st = _check_alive(self, call)
        cws, flats = [], []
        for outs, t in zip(output_tensors, input_tensors):
            if len(outs) != self.size():
                raise error(f"rank {st.id}: {call}: tensor_list has {len(outs)} tensors; "
                            f"{self.describe()} has {self.size()} ranks")
            flat = torch.empty((self.size() * t.numel(),), dtype=t.dtype, device=t.device)
            cws.append(self._api.all_gather(self.cg, self._arr(flat, call, "output"),
                                         self._arr(t, call, "tensor"), async_op=True))
            flats.append((flat, outs, t.numel()))

        def finish():
            for flat, outs, n in flats:
                for i, o in enumerate(outs):
                    o.copy_(flat[i * n:(i + 1) * n].view(o.shape))
        outputs = [f for f, _, _ in flats] + [o for outs in output_tensors for o in outs]
        return self._work(cws[0] if len(cws) == 1 else _Joined(cws), call, outputs, finish,
                          inputs=input_tensors, result=output_tensors)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """output_lists[r][i] = rank r's input_list[i]: one all_gather of the inputs concatenated
        (per rank), copied back at wait()."""
        call = "all_gather_coalesced"
        st = _check_alive(self, call)
        n = self.size()
        if len(output_lists) != n or any(len(o) != len(input_list) for o in output_lists):
            raise error(f"rank {st.id}: {call}: output_tensor_lists must hold {n} lists (one per "
                        f"rank of {self.describe()}) of {len(input_list)} tensors each")
        if not input_list:
            return self._work(_Joined([]), call)
        if len({t.dtype for t in input_list}) != 1:
            raise error(f"rank {st.id}: {call}: the input tensors mix dtypes")
        inp = torch.cat([t.reshape(-1) for t in input_list])
        flat = torch.empty((n * inp.numel(),), dtype=inp.dtype, device=inp.device)
        cw = self._api.all_gather(self.cg, self._arr(flat, call, "output"),
                               self._arr(inp, call, "input"), async_op=True)

        def finish():
            off = 0
            for outs in output_lists:
                for o in outs:
                    o.copy_(flat[off:off + o.numel()].view(o.shape))
                    off += o.numel()
        return self._work(cw, call, (flat, *(o for outs in output_lists for o in outs)), finish,
                          inputs=(inp,), result=output_lists)

    def all_gather_single(self, output, input, opts=None):
        call = "all_gather_into_tensor"
        _check_alive(self, call)
        with self._launch(opts):
            cw = self._api.all_gather(self.cg, self._arr(output, call, "output"),
                                      self._arr(input, call, "input"), async_op=True)
        return self._work(cw, call, (output,), inputs=(input,))

    _allgather_base = all_gather_single  # the names torch's functions called before 2.13

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        call = "all_gather_into_tensor_coalesced"
        _check_alive(self, call)
        cws = [self._api.all_gather(self.cg, self._arr(o, call, "output"),
                                 self._arr(i, call, "input"), async_op=True)
               for o, i in zip(outputs, inputs)]
        return self._work(_Joined(cws), call, outputs, inputs=inputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # its name before torch 2.13

    def reduce_scatter(self, outputs, input_lists, opts=None):
        call = "reduce_scatter"
        st = _check_alive(self, call)
        cws, keep = [], []
        for out, ins in zip(outputs, input_lists):
            if len(ins) != self.size():
                raise error(f"rank {st.id}: {call}: input_list has {len(ins)} tensors; "
                            f"{self.describe()} has {self.size()} ranks")
            flat = torch.cat([t.reshape(-1) for t in ins])
            keep.append(flat)
            cws.append(self._rs(out, flat, opts, call))
        return self._work(cws[0] if len(cws) == 1 else _Joined(cws), call, outputs,
                          inputs=keep)

    def _rs(self, output, input, opts, call):
        op = _op(opts.reduceOp if opts is not None else None, self._st, call)
        return self._api.reduce_scatter(self.cg, self._arr(output, call, "output"),
                                     self._arr(input, call, "input"), op=op, async_op=True)

    def reduce_scatter_single(self, output, input, opts=None):
        call = "reduce_scatter_tensor"
        _check_alive(self, call)
        return self._work(self._rs(output, input, opts, call), call, (output,), inputs=(input,))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        call = "reduce_scatter_tensor_coalesced"
        _check_alive(self, call)
        cws = [self._rs(o, i, opts, call) for o, i in zip(outputs, inputs)]
        return self._work(_Joined(cws), call, outputs, inputs=inputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # before torch 2.13

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                          opts=None):
        call = "all_to_all_single"
        _check_alive(self, call)

        def rows(t):  # splits count rows of dimension 0: the tensor as [rows, the rest]
            if t.dim() == 0:
                return (1, 1)
            return (t.shape[0], t.numel() // t.shape[0] if t.shape[0] else 0)
        shape_in, shape_out = rows(input), rows(output)
        outs, ins = list(output_split_sizes or ()), list(input_split_sizes or ())
        splits = {}
        if outs or ins:
            n = self.size()
            splits = dict(output_splits=outs or [shape_out[0] // n] * n,
                          input_splits=ins or [shape_in[0] // n] * n)
        cw = self._api.all_to_all(self.cg, self._arr(output, call, "output", shape_out),
                               self._arr(input, call, "input", shape_in), async_op=True,
                               **splits)
        return self._work(cw, call, (output,), inputs=(input,))

    alltoall_base = all_to_all_single

    def alltoall(self, output_list, input_list, opts=None):
        """all_to_all with tensor lists: one all_to_all_single over the lists concatenated
        (uneven sizes as splits), copied back at wait()."""
        call = "all_to_all"
        st = _check_alive(self, call)
        n = self.size()
        if len(output_list) != n or len(input_list) != n:
            raise error(f"rank {st.id}: {call}: {len(output_list)} output and {len(input_list)} "
                        f"input tensors; {self.describe()} has {n} ranks (one each)")
        dtypes = {t.dtype for t in (*output_list, *input_list)}
        if len(dtypes) != 1:
            raise error(f"rank {st.id}: {call}: the tensors mix dtypes {sorted(map(str, dtypes))}")
        inp = torch.cat([t.reshape(-1) for t in input_list])
        out = torch.empty((sum(t.numel() for t in output_list),), dtype=inp.dtype,
                          device=output_list[0].device)
        cw = self._api.all_to_all(self.cg, self._arr(out, call, "output", (out.numel(), 1)),
                               self._arr(inp, call, "input", (inp.numel(), 1)), async_op=True,
                               output_splits=[t.numel() for t in output_list],
                               input_splits=[t.numel() for t in input_list])

        def finish():
            off = 0
            for t in output_list:
                t.copy_(out[off:off + t.numel()].view(t.shape))
                off += t.numel()
        return self._work(cw, call, (out, *output_list), finish, inputs=(inp,),
                          result=output_list)

    def broadcast(self, tensors, opts=None):
        call = "broadcast"
        _check_alive(self, call)
        root = self._root(opts.rootRank if opts is not None else 0, call, "src")
        with self._launch(opts):
            cws = [self._api.broadcast(self.cg, self._arr(t, call, "tensor"), root,
                                       async_op=True) for t in tensors]
        return self._work(cws[0] if len(cws) == 1 else _Joined(cws), call, tensors)

    def reduce(self, tensors, opts=None):
        call = "reduce"
        st = _check_alive(self, call)
        root = self._root(opts.rootRank, call, "dst")
        op = _op(opts.reduceOp, st, call)
        with self._launch(opts):
            cws = [self._api.reduce(self.cg, self._arr(t, call, "tensor"), root, op=op,
                                    async_op=True) for t in tensors]
        return self._work(cws[0] if len(cws) == 1 else _Joined(cws), call, tensors)

    def gather(self, output_lists, inputs, opts=None):
        call = "gather"
        st = _check_alive(self, call)
        root = self._root(opts.rootRank, call, "dst")
        tensor = inputs[0]
        flat, finish, outs = None, None, []
        if self.rank() == root:
            outs = output_lists[0] if output_lists else []
            if len(outs) != self.size():
                raise error(f"rank {st.id}: {call}: the destination needs a gather_list of "
                            f"{self.size()} tensors for {self.describe()}, got {len(outs)}")
            flat = torch.empty((self.size() * tensor.numel(),), dtype=tensor.dtype,
                               device=tensor.device)

            def finish():
                n = tensor.numel()
                for i, t in enumerate(outs):
                    t.copy_(flat[i * n:(i + 1) * n].view(t.shape))
        elif output_lists and output_lists[0]:
            raise error(f"rank {st.id}: {call}: gather_list must be empty on a non-destination "
                        f"rank")
        out = None if flat is None else self._arr(flat, call, "gather_list")
        cw = self._api.gather(self.cg, out, self._arr(tensor, call, "tensor"), root, async_op=True)
        return self._work(cw, call, (flat, *outs), finish, inputs=(tensor,),
                          result=output_lists)

    def scatter(self, outputs, input_lists, opts=None):
        call = "scatter"
        st = _check_alive(self, call)
        root = self._root(opts.rootRank, call, "src")
        flat = None
        if self.rank() == root:
            ins = input_lists[0] if input_lists else []
            if len(ins) != self.size():
                raise error(f"rank {st.id}: {call}: the source needs a scatter_list of "
                            f"{self.size()} tensors for {self.describe()}, got {len(ins)}")
            flat = torch.cat([t.reshape(-1) for t in ins])
        elif input_lists and input_lists[0]:
            raise error(f"rank {st.id}: {call}: scatter_list must be empty on a non-source rank")
        inp = None if flat is None else self._arr(flat, call, "scatter_list")
        cw = self._api.scatter(self.cg, self._arr(outputs[0], call, "tensor"), inp, root,
                            async_op=True)
        return self._work(cw, call, outputs)

    def barrier(self, opts=None):
        _check_alive(self, "barrier")
        return self._work(self._api.barrier(self.cg, async_op=True), "barrier")

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """A barrier bounded by `timeout` (a timedelta or seconds; default: the run's timeout)
        whose error names the ranks that did not arrive, in gloo's words (group rank 0 reports
        "Rank r failed to pass monitoredBarrier", or every missing rank with wait_all_ranks).
        torch's dist.monitored_barrier refuses every backend but gloo before calling a group;
        call it on the group: `group.monitored_barrier(timeout)`."""
        import time
        st = _check_alive(self, "monitored_barrier")
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else \
            (st.timeout_s if timeout is None else float(timeout))
        arrivals = st.shared_object(("monitored_barrier", self.cg.name, tuple(self.ranks)),
                                    "Arrivals")
        n = arrivals.arrive(self.rank())
        deadline = time.monotonic() + seconds
        delay = 2e-5
        while True:
            missing = arrivals.missing(n, self.size())
            if not missing:
                break
            if time.monotonic() >= deadline:
                ms = int(seconds * 1000)
                if self.rank() == 0:
                    shown = missing if wait_all_ranks else missing[:1]
                    what = (f"Ranks {', '.join(map(str, shown))}" if len(shown) > 1
                            else f"Rank {shown[0]}")
                    detail = f"{what} failed to pass monitoredBarrier in {ms} ms"
                else:
                    detail = f"group rank{'s' if len(missing) > 1 else ''} " \
                             f"{', '.join(map(str, missing))} did not call it"
                raise error(f"Rank {self.rank()} timed out in monitoredBarrier after {ms} ms on "
                            f"{self.describe()} (world rank {st.id}): {detail}; world ranks not "
                            f"arrived: {[self.ranks[r] for r in missing]}", code="timeout")
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)
        self.barrier().wait()

    # --- point to point -----------------------------------------------------------------------

    def _p2p(self, kind, tensors, peer, tag):
        call = "send" if kind == "send" else "recv"
        st = _check_alive(self, call)
        peer = self._root(peer, call, "dst" if kind == "send" else "src")
        tensor = tensors[0]
        arr = self._arr(tensor, call, "tensor")
        key = (self.cg.name, tuple(self.ranks), tag)
        if kind == "send":
            _mailbox(st).note_send(key + (peer,), self.rank())
        outputs, inputs = ((), (tensor,)) if kind == "send" else ((tensor,), ())
        what = f"{'isend to' if kind == 'send' else 'irecv from'} group rank {peer}"
        ops = _torch2.batch_p2p_ops()
        batch = self._batch
        if batch is None and ops is not None:  # inside batch_isend_irecv: one batch
            batch = st.p2p_batches.get(id(ops))
            if batch is None or batch.cw is not None:
                batch = st.p2p_batches[id(ops)] = _Batch(self, len(ops))
        if batch is not None:
            w = Work(st, batch, "batch_isend_irecv", self, outputs, inputs=inputs)
            batch.add((kind, arr, peer, tag))
            if batch.cw is not None:
                st.p2p_batches.pop(id(ops), None)
            return w
        fn = self._api.isend if kind == "send" else self._api.irecv
        return self._work(fn(self.cg, arr, peer, tag), what, outputs, inputs=inputs)

    def send(self, tensors, dst, tag=0):
        return self._p2p("send", tensors, dst, tag)

    def recv(self, tensors, src, tag=0):
        st = _check_alive(self, "recv")
        if isinstance(src, int) and 0 <= src < self.size():
            _mailbox(st).note_recv((self.cg.name, tuple(self.ranks), tag, self.rank()), src)
        w = self._p2p("recv", tensors, src, tag)
        w._source = src
        return w

    def recv_anysource(self, tensors, tag=0):
        """A receive from any source: the lowest-ranked sender with an unclaimed message to this
        rank (waits for one, bounded by the run's timeout); Work._source_rank() names it."""
        st = _check_alive(self, "recv")
        key = (self.cg.name, tuple(self.ranks), tag, self.rank())
        found = []

        def claimed():
            src = _mailbox(st).claim(key)
            if src is not None:
                found.append(src)
            return bool(found)
        _state.wall_wait(claimed, st, f"recv from any source on {self.describe()} (tag {tag}): "
                         f"no rank sent to rank {st.id}")
        w = self._p2p("recv", tensors, found[0], tag)
        w._source = found[0]
        return w

    # --- coalescing (torch's _coalescing_manager with a device) ---------------------------

    def _start_coalescing(self, device=None):
        st = _check_alive(self, "_start_coalescing")
        if self._coalescing is not None:
            raise error(f"rank {st.id}: _start_coalescing on {self.describe()}: already "
                        f"coalescing")
        self._coalescing = []
        self._batch = _Batch(self, None)

    def _end_coalescing(self, device=None):
        st = _check_alive(self, "_end_coalescing")
        if self._coalescing is None:
            raise error(f"rank {st.id}: _end_coalescing on {self.describe()} without "
                        f"_start_coalescing")
        works, batch = self._coalescing, self._batch
        self._coalescing = self._batch = None
        batch.launch()
        parts = [w._cw for w in works] + ([batch] if batch.ops else [])
        return Work(st, _Joined(parts), "coalesced calls", self,
                    finish=lambda: [w._complete() for w in works])


def _group(group, st, call):
    """The calling rank's cocemu ProcessGroup for `group` (None: the world), or a clear error."""
    if group is None:
        return st.world
    if isinstance(group, int) and group == _torch2.NON_GROUP_MEMBER:
        raise error(f"rank {st.id}: {call} on a group rank {st.id} is not a member of "
                    f"(new_group gave this rank GroupMember.NON_GROUP_MEMBER)")
    if isinstance(group, ProcessGroup) and group in st.groups:
        return group
    hint = ""
    if st.process is None and isinstance(group, ProcessGroup):
        hint = (f"; on rank threads, module-level state (Megatron's parallel_state, a global "
                f"holding a group) is shared by every rank, so one rank's group reaches another: "
                f"run the ranks as processes (cocemu.torch.run(..., processes=True), or torchrun "
                f"with init_process_group('cocemu'))")
    raise error(f"rank {st.id}: {call}: group {group!r} is not one of rank {st.id}'s cocemu "
                f"groups (use None, the world, or what new_group returned on this rank){hint}")


def _array(t, st, call, what, shape=None):
    """A torch tensor as the array cocemu's collective takes, sharing its memory."""
    if not isinstance(t, torch.Tensor):
        raise error(f"rank {st.id}: {call}: {what} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype in COMPLEX:  # complex: the pairs of reals (sums and copies are exact per part)
        if shape is not None:
            shape = tuple(shape[:-1]) + (shape[-1] * 2,)
        t = torch.view_as_real(t) if t.is_contiguous() else t
    name = DTYPES.get(t.dtype)
    if name is None:
        allowed = ", ".join(str(d).replace("torch.", "") for d in (*DTYPES, *COMPLEX))
        raise error(f"rank {st.id}: {call}: {what} has dtype {t.dtype}; allowed: {allowed}")
    if not t.is_contiguous():
        raise error(f"rank {st.id}: {call}: {what} {tuple(t.shape)} is not contiguous "
                    f"(torch.distributed requires contiguous tensors; call .contiguous())")
    shape = tuple(shape) if shape is not None else (t.numel(),)
    if not st.numerics:
        if t.device.type != "meta":
            raise error(f"rank {st.id}: {call}: {what} {tuple(t.shape)} {t.dtype} is on "
                        f"{t.device} in a run with numerics=False (a dry run: the collective "
                        f"would leave it unchanged); create it on the device "
                        f"(device='cuda'/'npu' or torch.npu.current_device(), the meta device "
                        f"here)")
        return st.api.Tensor.shape_only(shape, name)
    if t.device.type != "cpu":
        raise error(f"rank {st.id}: {call}: {what} is on {t.device}; cocemu.torch tensors are "
                    f"CPU tensors (meta with numerics=False); use torch.npu.current_device()")
    t = t.detach().reshape(shape)
    if st.process is not None:  # a rank process: a large tensor's storage is shared, not copied
        from . import _processes
        _processes.share_storage(st, t)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _op(op, st, call):
    if op is None:
        return "sum"
    name = _torch2.reduce_op_name(op)
    if name is None:
        raise error(f"rank {st.id}: {call}: reduce op {op!r} is not supported; allowed: SUM, AVG, "
                    f"MAX, MIN, PRODUCT")
    return name


# --- the backend -------------------------------------------------------------------------------

def _create(options):
    """torch's init_process_group("cocemu") on a rank thread: the world group."""
    st = _state.current()
    if st is None:  # a process of its own (torchrun): the rank connects to the run's hub
        from . import _processes
        st = _processes.attach_torchrun(options)
    elif st.process is not None:
        st.ended = False  # init_process_group again after destroy_process_group
    if options.group_size != st.world_size or options.group_rank != st.id:
        raise error(f"rank {st.id}: init_process_group('cocemu'): rank {options.group_rank} of "
                    f"world_size {options.group_size} given on rank {st.id}'s thread of a run of "
                    f"{st.world_size} ranks")
    return ProcessGroup(st, st.rank.world, range(st.world_size), "world")


def install():
    """Registers the backend and the per-thread world with torch (once)."""
    _torch2.install_world(lambda: getattr(_state.current(), "c10d_world", None))
    _torch2.register_backend(_create)
    _args.install()


def start_rank(st, store, timeout_s):
    """ct.run, on a rank thread: the rank's own c10d world, its default group initialised by
    torch's init_process_group("cocemu")."""
    import datetime
    st.c10d_world = _torch2.RankWorld()
    _torch2.init_default_group(st.id, st.world_size, store,
                               datetime.timedelta(seconds=timeout_s))
    st.world = _torch2.default_group()


def end_rank(st, failing=False):
    """The run ends on this rank: its groups refuse calls from now on and its c10d world is
    destroyed (an error there is raised unless the rank is already failing)."""
    st.ended = True
    try:
        _torch2.destroy_groups()
    except Exception:
        if not failing:
            raise
    finally:
        st.c10d_world = None
