// Shared between the parts of the job spec implementation; not for use outside common/.
#ifndef DROPLESS_COMMON_JOB_SPEC_INTERNAL_H_
#define DROPLESS_COMMON_JOB_SPEC_INTERNAL_H_

#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/job_spec.h"

namespace dropless::internal {

// The YAML spelling of each enum value; ToString and the parser both use these.
inline const std::vector<std::pair<std::string_view, RouterKind>> kRouterNames = {
    {"softmax", RouterKind::kSoftmax}, {"sigmoid", RouterKind::kSigmoid}};
inline const std::vector<std::pair<std::string_view, Activation>> kActivationNames = {
    {"swiglu", Activation::kSwiGLU}};
inline const std::vector<std::pair<std::string_view, Precision>> kPrecisionNames = {
    {"bf16", Precision::kBf16},
    {"mxfp8", Precision::kMxfp8},
    {"fp8-block", Precision::kFp8Block},
    {"fp8-block-wgrad128", Precision::kFp8BlockWgrad128}};
inline const std::vector<std::pair<std::string_view, Dispatcher>> kDispatcherNames = {
    {"auto", Dispatcher::kAuto},
    {"gloo", Dispatcher::kGloo},
    {"nccl-a2a", Dispatcher::kNcclA2a},
    {"nccl-lsa", Dispatcher::kNcclLsa},
    {"nccl-ep", Dispatcher::kNcclEp}};
inline const std::vector<std::pair<std::string_view, RoutingDistribution>> kDistributionNames = {
    {"uniform", RoutingDistribution::kUniform}, {"zipf", RoutingDistribution::kZipf}};
inline const std::vector<std::pair<std::string_view, Backend>> kBackendNames = {
    {"cpu", Backend::kCpu}, {"cuda", Backend::kCuda}};
inline const std::vector<std::pair<std::string_view, MomentDtype>> kMomentDtypeNames = {
    {"fp32", MomentDtype::kFp32}, {"bf16", MomentDtype::kBf16}};

// Value ranges and the rules that span fields, on a spec whose fields all parsed. The first
// failure, as InvalidArgument "<field path>: <rule> (got ...)".
absl::Status CheckJobSpecRules(const JobSpec& spec);

}  // namespace dropless::internal

#endif  // DROPLESS_COMMON_JOB_SPEC_INTERNAL_H_
