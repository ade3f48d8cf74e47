// CreateGlooGroups: one TCP device per rank process, one Gloo context per group, each rendezvoused
// under its own key prefix of the job attempt's store:
//   world/<rank>           every rank
//   ep/<dp_rank>/<ep_rank> the EP group of one dp_rank
//   dp/<ep_rank>/<dp_rank> the DP group of one ep_rank
#include <exception>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "worker/transport/gloo_communicator.h"
#include "worker/transport/gloo_store_bridge.h"
#include "worker/transport/rank_layout.h"
#include "worker/transport/transport_factory.h"

namespace dropless {
namespace {

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGroup(
    const std::string& prefix, int rank, int size, gloo::rendezvous::Store& store,
    const std::shared_ptr<gloo::transport::Device>& device, const GlooOptions& options) {
  // PrefixStore's constructor does not throw; Connect catches everything after it.
  gloo::rendezvous::PrefixStore group_store(prefix, store);
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> comm = GlooCommunicator::Connect(
      prefix, rank, size, group_store, device, options.connect_timeout, options.collective_timeout);
  if (!comm.ok()) return comm.status();
  return std::unique_ptr<Communicator>(std::move(*comm));
}

}  // namespace

absl::StatusOr<RankGroups> CreateGlooGroups(const GlooOptions& options, KeyValueStore* store) {
  const GroupLayout& layout = options.layout;
  if (absl::Status s = ValidateGroupLayout(layout); !s.ok()) return s;
  if (store == nullptr) return absl::InvalidArgumentError("store must not be null");
  if (options.host.empty()) return absl::InvalidArgumentError("host must not be empty");
  if (options.connect_timeout <= absl::ZeroDuration() ||
      options.collective_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "timeouts must be positive, got connect ", absl::FormatDuration(options.connect_timeout),
        " and collective ", absl::FormatDuration(options.collective_timeout)));
  }

  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.host;
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    absl::Status s = StatusFromGlooException(
        e, absl::StrCat("creating the gloo TCP device on host ", options.host));
    // A host this machine cannot bind is a configuration error, not a transient one.
    return absl::InvalidArgumentError(s.message());
  }

  GlooStoreBridge bridge(store, options.connect_timeout);
  const int ep_rank = EpRankOf(layout.rank, layout.ep);
  const int dp_rank = DpRankOf(layout.rank, layout.ep);
  RankGroups groups;
  absl::StatusOr<std::unique_ptr<Communicator>> world =
      ConnectGroup("world", layout.rank, layout.world_size, bridge, device, options);
  if (!world.ok()) return world.status();
  groups.world = std::move(*world);
  absl::StatusOr<std::unique_ptr<Communicator>> ep =
      ConnectGroup(absl::StrCat("ep/", dp_rank), ep_rank, layout.ep, bridge, device, options);
  if (!ep.ok()) return ep.status();
  groups.ep = std::move(*ep);
  absl::StatusOr<std::unique_ptr<Communicator>> dp =
      ConnectGroup(absl::StrCat("dp/", ep_rank), dp_rank, layout.dp, bridge, device, options);
  if (!dp.ok()) return dp.status();
  groups.dp = std::move(*dp);
  return groups;
}

}  // namespace dropless
