#pragma once
// The one place that looks at the compiler: host/device annotations and the library version.
#if defined(__CUDACC__)
#define LING_HOST_DEVICE __host__ __device__
#define LING_DEVICE __device__
#define LING_FORCEINLINE __forceinline__
#else
#define LING_HOST_DEVICE
#define LING_DEVICE
#define LING_FORCEINLINE inline
#endif

#define LING_VERSION_MAJOR 0
#define LING_VERSION_MINOR 1
#define LING_VERSION_PATCH 0

namespace ling {
inline constexpr char const* kVersion = "0.1.0";
}  // namespace ling
