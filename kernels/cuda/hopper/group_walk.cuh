// The group-by-group part of a grouped kernel's persistent tile walk. A CTA strides through linear
// tile indices, and every role of the CTA (producer, scale loaders, consumers) walks the same
// sequence, so no role needs to tell another which tile comes next. The groups' row offsets are
// read on the device (no host synchronization): group g holds rows [offsets[g], offsets[g + 1]),
// both clamped to [0, offset_limit], and its tiles follow those of the groups before it. Part of
// the Hopper layer (README.md beside this file).
#ifndef DROPLESS_KERNELS_CUDA_HOPPER_GROUP_WALK_CUH_
#define DROPLESS_KERNELS_CUDA_HOPPER_GROUP_WALK_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace dropless::kernels::hopper {

// Params: the kernel's parameters, with `offsets` ([num_groups + 1], device), `num_groups` and
// `offset_limit`. Derived (a kernel family's walker) derives from GroupWalk<Derived, Params>,
// defines `int GroupTiles()`, the tiles of group g given lo and hi (it may keep per-group values,
// such as the group's M tiles, for its Next), and maps t - first, the tile's index within the
// group, to its tile.
template <class Derived, class Params>
struct GroupWalk {
  const Params& p;
  int g = -1;
  int first = 0;       // linear index of group g's first tile
  int count = 0;       // tiles of group g
  int lo = 0, hi = 0;  // group g's rows, clamped

  __device__ explicit GroupWalk(const Params& params) : p(params) {}

  __device__ int Clamp(int v) const {
    return static_cast<int>(min(max(static_cast<int64_t>(v), int64_t{0}), p.offset_limit));
  }

  __device__ void Enter(int group) {
    g = group;
    lo = Clamp(__ldg(p.offsets + group));
    hi = max(lo, Clamp(__ldg(p.offsets + group + 1)));
    count = static_cast<Derived*>(this)->GroupTiles();
  }

  // Moves to the group holding linear tile t (t does not decrease from call to call); false once t
  // is past the last group's tiles.
  __device__ bool Seek(int t) {
    if (g < 0) Enter(0);
    while (t >= first + count) {
      if (g + 1 >= p.num_groups) return false;
      first += count;
      Enter(g + 1);
    }
    return true;
  }
};

}  // namespace dropless::kernels::hopper

#endif  // DROPLESS_KERNELS_CUDA_HOPPER_GROUP_WALK_CUH_
