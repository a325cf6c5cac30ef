// Entry point for the CUDA backend as seen from core/dispatch.cpp. When ampforge is built without
// CUDA there is nothing to register, and ensure_backends_registered() learns that from `false`.
namespace ampforge {

#if !defined(AMPFORGE_WITH_CUDA)
bool register_cuda_backend() { return false; }
#endif

}  // namespace ampforge
