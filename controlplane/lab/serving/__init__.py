"""tools/bench-serving's reusable parts: the fleet and its capacity, the workload (arrivals,
lengths), the accounting (percentiles, goodput), the join-the-shortest-queue bound, the
streaming client and the HAProxy peer. Pure modules (workload, accounting, jsq) need no root."""
