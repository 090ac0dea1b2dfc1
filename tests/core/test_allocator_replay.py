"""The BFC allocator model of ``tests/scripts/allocator_replay.py``, on hand-made request
sequences (no TensorFlow): TensorFlow's rules, and the replay of recorded events."""
from tests.scripts.allocator_replay import BestFitAllocator, MiB, replay


def test_a_chunk_under_twice_the_request_is_handed_out_whole():
    allocator = BestFitAllocator()
    assert allocator.allocate(100).size == 256  # rounded up to 256 bytes
    big = allocator.allocate(37 * MiB)  # a region of its own, doubled to 64 MiB
    assert big.size == 64 * MiB  # under twice 37 MiB: handed out whole
    allocator.release(big)  # merged back with the rest of its region: 64 MiB free
    scratch = allocator.allocate(22 * MiB + 512 * 1024)
    assert scratch.size == 22 * MiB + 512 * 1024  # 64 >= 2 x 22.5: split
    allocator.release(scratch)
    first = allocator.allocate(20 * MiB)  # split off the 64 MiB chunk
    rest = allocator.allocate(30 * MiB)  # the 44 MiB left: under twice 30, whole
    assert (first.size, rest.size) == (20 * MiB, 44 * MiB)
    assert allocator.in_use - allocator.requested == 14 * MiB + 256 - 100


def test_a_reserved_region_splits_what_growing_regions_hand_out_whole():
    growing, reserved = BestFitAllocator(), BestFitAllocator(reserved=1 << 30)
    assert growing.allocate(37 * MiB).size == 64 * MiB  # a region of its own, whole
    assert reserved.allocate(100).size == 256  # the first region takes the small requests
    big = reserved.allocate(37 * MiB)
    assert big.size == 37 * MiB  # split from the 1 GiB region
    scratch = reserved.allocate(22 * MiB + 512 * 1024)
    assert scratch.start == big.start + big.size  # the next bytes of the same region
    reserved.release(big)
    # 37 MiB free before the scratch: the smallest chunk that fits 30 MiB, under twice it
    assert reserved.allocate(30 * MiB).size == 37 * MiB


def test_freed_neighbours_merge_and_the_smallest_fitting_chunk_is_taken():
    allocator = BestFitAllocator()
    a, b, c = (allocator.allocate(MiB // 2) for _ in range(3))  # one 2 MiB region
    allocator.release(a)
    allocator.release(c)  # merged with the region's free 0.5 MiB tail: 1 MiB
    # 0.5 MiB (a's) is the smallest free chunk that fits: taken whole
    assert allocator.allocate(MiB // 2).start == a.start
    allocator.release(b)  # merges with the 1 MiB after it: 1.5 MiB free
    assert allocator.allocate(MiB).size == 3 * MiB // 2  # under twice 1 MiB: whole


def test_a_lower_split_threshold_splits():
    default, eager = BestFitAllocator(), BestFitAllocator(split_above=MiB)
    for allocator in (default, eager):
        allocator.release(allocator.allocate(30 * MiB))  # one free 32 MiB region
    assert default.allocate(20 * MiB).size == 32 * MiB
    assert eager.allocate(20 * MiB).size == 20 * MiB


def _event(op, address, nbytes, requested=0):
    return (0, "bfc", op, address, nbytes, 0, requested)


def test_replay_leaves_the_hosts_chunks_out_of_the_device_peak():
    # recorded: 3 MiB asked in a 4 MiB region (whole), the host's 1 MiB copy in a region
    # of its own (split: 3 MiB left), then a 3 MiB request takes that 3 MiB chunk
    events = [_event("relu", 1, 4 * MiB, 3 * MiB),
              _event("swap_out", 2, MiB, MiB),
              _event("", 1, -4 * MiB),
              _event("conv", 3, 3 * MiB, 3 * MiB)]
    shared = replay(events, {"swap_out"})
    assert (shared.device_peak, shared.requested_at_peak) == (4 * MiB, 3 * MiB)
    assert (shared.as_recorded, shared.allocations) == (3, 3)
    # with the host's copy elsewhere, the 3 MiB request takes relu's 4 MiB chunk whole
    apart = replay(events, {"swap_out"}, host_apart=True)
    assert (apart.device_peak, apart.as_recorded) == (4 * MiB, 2)
