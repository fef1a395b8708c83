// GPU (ctest label gpu, from the `_gpu` suffix): a sticky device fault in `megadecode serve` takes
// the backend-failure path end to end. The child server runs the tiny preset's random weights on a
// CUDA backend with the test-only hook MEGADECODE_TEST_DEVICE_FAULT_STEP (cuda/backend/
// device_fault.h): decode step 2 launches a kernel that writes to an unmapped address, the step's
// CUDA_CHECK throws a sticky DeviceError (cudaErrorIllegalAddress), both streams in flight end with
// an error event naming a sticky device error and [DONE], and the process exits 1. Like every GPU test it fails without
// a GPU unless MEGADECODE_ALLOW_NO_GPU is set.
#include <gtest/gtest.h>

#if defined(MEGADECODE_HAVE_CUDA)
#include <cstdlib>
#include <future>

#include "../server/server_fixture.h"
#include "cuda/common/device_info.h"
#include "process.h"

namespace megadecode {
namespace {

using nlohmann::json;
using testing::Process;

json stream_body(int first_token) {
  return {{"prompt", {first_token, 2, 3}}, {"max_tokens", 200}, {"ignore_eos", true}, {"stream", true}};
}

void check_fault_ends_serve(const std::string& backend) {
  SCOPED_TRACE(backend);
  Process p({"serve", "--random-weights", "--preset", "tiny", "--backend", backend, "--skip-tokenizer-init", "--port",
             "0", "--max-num-seqs", "8", "--gpu-memory-utilization", "0.5"},
            {"MEGADECODE_TEST_DEVICE_FAULT_STEP=2"});
  const int port = p.wait_port(std::chrono::seconds(180));
  ASSERT_GT(port, 0) << p.err();
  std::vector<std::future<testing::HttpResult>> streams;
  for (int i = 0; i < 2; ++i)
    streams.push_back(std::async(std::launch::async, [port, i] {
      testing::HttpClient c(port);
      return c.request("POST", "/v1/completions", stream_body(10 + i).dump());
    }));
  for (auto& f : streams) {
    const testing::HttpResult r = f.get();
    const std::vector<std::string> events = testing::sse_data(r.body);
    ASSERT_FALSE(events.empty()) << r.body;
    EXPECT_EQ(events.back(), "[DONE]") << r.body;
    bool error_named = false;
    for (const std::string& e : events) {
      const json j = json::parse(e, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("error")) {
        const std::string m = j["error"]["message"].get<std::string>();
        error_named = m.find("device error cuda") != std::string::npos &&
                      m.find("the device context is lost") != std::string::npos;
      }
    }
    EXPECT_TRUE(error_named) << r.body;
  }
  EXPECT_EQ(p.wait_exit(std::chrono::seconds(60)), 1) << p.err();
  EXPECT_NE(p.err().find("MEGADECODE_TEST_DEVICE_FAULT_STEP"), std::string::npos) << p.err();
}

TEST(ServeDeviceFault, StickyFaultEndsStreamsWithAnErrorAndExitsOne) {
  if (!cuda::gpu_available()) {
    if (std::getenv("MEGADECODE_ALLOW_NO_GPU") != nullptr) GTEST_SKIP() << "no GPU (allowed)";
    FAIL() << "no CUDA GPU found (set MEGADECODE_ALLOW_NO_GPU=1 to skip instead)";
  }
  check_fault_ends_serve("cuda-mk");
  check_fault_ends_serve("cuda-batched");
}

}  // namespace
}  // namespace megadecode
#endif
