// Litmus test for compute-sanitizer racecheck: a producer warp fills a shared buffer, a
// consumer warp reads it, round after round, through one slot guarded by a `full` and an
// `empty` hand-off. The variant (argv[1]) picks the hand-off:
//   0 syncthreads     __syncthreads() both ways (the control racecheck understands)
//   1 every-lane      each of the 32 lanes arrives on an mbarrier expecting 32 arrivals
//   2 warp-sync-lane0 bar.warp.sync, then lane 0 arrives on an mbarrier expecting 1
//                     (pykittens' pk.arrive on sm_90a)
//   3 lane0-only      lane 0 arrives without bar.warp.sync (other lanes' writes unordered)
//   4 none            no hand-off at all: a real race
// Every variant checks what the consumer read; the program prints the mismatches.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

constexpr int WIDTH = 256;            // floats per round: 8 per lane

__device__ __forceinline__ uint32_t shared_addr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_addr(b)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_addr(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, int parity) {
  asm volatile(
      "{ .reg .pred P; WAIT: mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1; "
      "@!P bra WAIT; }" ::"r"(shared_addr(b)), "r"(parity)
      : "memory");
}

__device__ __forceinline__ void hand_over(int variant, uint64_t *bar, int lane) {
  if (variant == 1) {
    mbar_arrive(bar);
  } else if (variant == 2) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  } else if (variant == 3) {
    if (lane == 0) mbar_arrive(bar);
  }
}

__global__ void handoff(int variant, int rounds, int *mismatches) {
  __shared__ float buf[WIDTH];
  __shared__ uint64_t full, empty;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int arrivals = variant == 1 ? 32 : 1;
  if (threadIdx.x == 0) {
    mbar_init(&full, arrivals);
    mbar_init(&empty, arrivals);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  int bad = 0;
  for (int r = 0; r < rounds; ++r) {
    const bool sync = variant == 0, barriers = variant >= 1 && variant <= 3;
    if (warp == 0) {                                   // producer
      if (barriers && r > 0) mbar_wait(&empty, (r - 1) & 1);
      for (int k = 0; k < WIDTH / 32; ++k) buf[k * 32 + lane] = float(r * WIDTH + k * 32 + lane);
      if (barriers) hand_over(variant, &full, lane);
    }
    if (sync) __syncthreads();                         // written -> readable
    if (warp == 1) {                                   // consumer, reading other lanes' data
      if (barriers) mbar_wait(&full, r & 1);
      for (int k = 0; k < WIDTH / 32; ++k) {
        const int i = k * 32 + (lane + 7) % 32;
        bad += buf[i] != float(r * WIDTH + i);
      }
      if (barriers) hand_over(variant, &empty, lane);
    }
    if (sync) __syncthreads();                         // read -> writable again
  }
  if (warp == 1) atomicAdd(mismatches, bad);
}

int main(int argc, char **argv) {
  const int variant = argc > 1 ? atoi(argv[1]) : 2;
  const int rounds = argc > 2 ? atoi(argv[2]) : 64;
  const int blocks = argc > 3 ? atoi(argv[3]) : 132;
  int *d = nullptr, h = 0;
  cudaMalloc(&d, sizeof(int));
  cudaMemset(d, 0, sizeof(int));
  handoff<<<blocks, 64>>>(variant, rounds, d);
  cudaError_t e = cudaDeviceSynchronize();
  cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
  printf("variant %d: %d mismatches over %d rounds x %d blocks (%s)\n", variant, h, rounds,
         blocks, cudaGetErrorString(e));
  return e != cudaSuccess;
}
