// The contract over real gRPC (an in-process server, default message limits): tensors larger
// than the 4 MiB message limit stream through FetchInputs and PushResult in codec pieces, and
// a handler's absl::Status reaches the client with its code, through status_util.
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "grpcpp/grpcpp.h"
#include "proto/adjsh.grpc.pb.h"
#include "proto/status_util.h"
#include "proto/tensor_codec.h"
#include "tests/common/test_util.h"

namespace adjsh {
namespace {

using ::adjsh::testing::StatusIs;

// Over the default 4 MiB receive limit as one message.
HostTensor BigTensor() {
  HostTensor t;
  t.dtype = DType::kF32;
  t.shape = {5, 1 << 18};  // 5 MiB
  t.data.resize(static_cast<size_t>(t.numel()) * 4);
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<uint8_t>(i % 251);
  return t;
}

// A toy TaskService: FetchInputs sends "u" (big) and "h0" (scalar); PushResult assembles what
// it receives, or fails with the assembler's status.
class FakeTaskService final : public v1::TaskService::Service {
 public:
  grpc::Status FetchInputs(grpc::ServerContext*, const v1::FetchInputsRequest* request,
                           grpc::ServerWriter<v1::TensorChunk>* writer) override {
    if (request->task_id() != "t1") {
      return ToGrpcStatus(absl::NotFoundError("unknown task " + request->task_id()));
    }
    const HostTensor h0 = HostTensor::From<float>(std::vector<float>{2.5f}, {}, DType::kF32);
    for (const auto& [name, tensor] : {std::pair<std::string, const HostTensor*>{"u", &big_},
                                       {"h0", &h0}}) {
      absl::Status s = StreamTensor(name, *tensor, kDefaultPieceBytes,
                                    [&](const v1::TensorChunk& c) {
                                      return writer->Write(c) ? absl::OkStatus()
                                                              : absl::CancelledError("client gone");
                                    });
      if (!s.ok()) return ToGrpcStatus(s);
    }
    return grpc::Status::OK;
  }

  grpc::Status PushResult(grpc::ServerContext*, grpc::ServerReader<v1::ResultChunk>* reader,
                          v1::PushResultResponse* response) override {
    v1::ResultChunk msg;
    if (!reader->Read(&msg) || !msg.has_header()) {
      return ToGrpcStatus(absl::InvalidArgumentError("a result stream starts with its header"));
    }
    TensorAssembler assembler(AssemblerLimits{.max_tensor_bytes = 8 << 20,
                                              .max_total_bytes = 8 << 20});
    while (reader->Read(&msg)) {
      absl::StatusOr<std::optional<NamedTensor>> done = assembler.Add(msg.tensor());
      if (!done.ok()) return ToGrpcStatus(done.status());
      if (done->has_value()) received_[(*done)->name] = std::move((*done)->tensor);
    }
    if (absl::Status s = assembler.Finish(); !s.ok()) return ToGrpcStatus(s);
    response->set_accepted(true);
    return grpc::Status::OK;
  }

  HostTensor big_ = BigTensor();
  TensorMap received_;
};

class GrpcStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::TaskService::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }
  void TearDown() override { server_->Shutdown(); }

  FakeTaskService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::TaskService::Stub> stub_;
};

TEST_F(GrpcStreamTest, FetchInputsStreamsATensorOverTheMessageLimit) {
  grpc::ClientContext ctx;
  v1::FetchInputsRequest request;
  request.set_task_id("t1");
  std::unique_ptr<grpc::ClientReader<v1::TensorChunk>> reader = stub_->FetchInputs(&ctx, request);
  TensorAssembler assembler;
  TensorMap got;
  v1::TensorChunk chunk;
  while (reader->Read(&chunk)) {
    absl::StatusOr<std::optional<NamedTensor>> done = assembler.Add(chunk);
    ASSERT_TRUE(done.ok()) << done.status();
    if (done->has_value()) got[(*done)->name] = std::move((*done)->tensor);
  }
  ASSERT_TRUE(FromGrpcStatus(reader->Finish()).ok());
  ASSERT_TRUE(assembler.Finish().ok());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got["u"].shape, service_.big_.shape);
  EXPECT_TRUE(got["u"].data == service_.big_.data);
  EXPECT_EQ(got["h0"].To<float>().value(), std::vector<float>{2.5f});
}

TEST_F(GrpcStreamTest, HandlerStatusReachesTheClientWithItsCode) {
  grpc::ClientContext ctx;
  v1::FetchInputsRequest request;
  request.set_task_id("nope");
  std::unique_ptr<grpc::ClientReader<v1::TensorChunk>> reader = stub_->FetchInputs(&ctx, request);
  v1::TensorChunk chunk;
  while (reader->Read(&chunk)) {
  }
  EXPECT_TRUE(StatusIs(FromGrpcStatus(reader->Finish()), absl::StatusCode::kNotFound,
                       "unknown task nope"));
}

TEST_F(GrpcStreamTest, PushResultStreamsTensorsAndLoss) {
  grpc::ClientContext ctx;
  v1::PushResultResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::ResultChunk>> writer =
      stub_->PushResult(&ctx, &response);
  v1::ResultChunk msg;
  msg.mutable_header()->set_task_id("t1");
  ASSERT_TRUE(writer->Write(msg));
  for (const v1::TensorChunk& c : SplitTensor("du", service_.big_)) {
    *msg.mutable_tensor() = c;
    ASSERT_TRUE(writer->Write(msg));
  }
  ASSERT_TRUE(writer->WritesDone());
  ASSERT_TRUE(FromGrpcStatus(writer->Finish()).ok());
  EXPECT_TRUE(response.accepted());
  ASSERT_EQ(service_.received_.count("du"), 1u);
  EXPECT_TRUE(service_.received_["du"].data == service_.big_.data);
}

TEST_F(GrpcStreamTest, AMalformedResultStreamIsInvalidArgumentAtTheClient) {
  grpc::ClientContext ctx;
  v1::PushResultResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::ResultChunk>> writer =
      stub_->PushResult(&ctx, &response);
  v1::ResultChunk msg;
  msg.mutable_header()->set_task_id("t1");
  ASSERT_TRUE(writer->Write(msg));
  std::vector<v1::TensorChunk> chunks = SplitTensor("du", service_.big_);
  chunks.erase(chunks.begin() + 1);  // a piece goes missing
  for (const v1::TensorChunk& c : chunks) {
    *msg.mutable_tensor() = c;
    if (!writer->Write(msg)) break;  // the server may already have failed the call
  }
  writer->WritesDone();
  EXPECT_TRUE(StatusIs(FromGrpcStatus(writer->Finish()), absl::StatusCode::kInvalidArgument,
                       "\"du\"", "contiguous"));
}

TEST_F(GrpcStreamTest, OneMessageOverTheLimitIsRefusedSoPiecesAreNeeded) {
  grpc::ClientContext ctx;
  v1::PushResultResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::ResultChunk>> writer =
      stub_->PushResult(&ctx, &response);
  v1::ResultChunk msg;
  msg.mutable_header()->set_task_id("t1");
  writer->Write(msg);
  *msg.mutable_tensor() = SplitTensor("du", service_.big_, service_.big_.data.size())[0];
  writer->Write(msg);
  writer->WritesDone();
  const absl::Status s = FromGrpcStatus(writer->Finish());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

}  // namespace
}  // namespace adjsh
