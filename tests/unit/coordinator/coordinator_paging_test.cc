// Status.GetJob's paging of a job's members (AIP-158): every member exactly
// once across the pages, in node-rank order; the default and maximum page
// sizes; refused page tokens; a membership that changes between pages;
// ListJobs's first pages; a page built a chunk at a time (JobPageBuilder).
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_page_builder.h"
#include "coordinator/member_page.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/coordinator_harness.h"

namespace baton::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

class CoordinatorPagingTest : public CoordinatorTest {
 protected:
  absl::StatusOr<v1::JobStatus> Page(const std::string& job, int32_t size,
                                     const std::string& token = "") {
    v1::GetJobRequest request;
    request.set_job(job);
    request.set_page_size(size);
    request.set_page_token(token);
    return coordinator_->GetJob(request);
  }

  // One page of `job` built by a JobPageBuilder `chunk` members per step;
  // `steps` counts the steps.
  absl::StatusOr<v1::JobStatus> PageInChunks(const std::string& job,
                                             int32_t size,
                                             const std::string& token,
                                             int32_t chunk, int* steps) {
    v1::GetJobRequest request;
    request.set_job(job);
    request.set_page_size(size);
    request.set_page_token(token);
    JobPageBuilder builder(request, chunk);
    for (++*steps; !builder.Step(*coordinator_); ++*steps) {
    }
    return builder.Take();
  }

  // Every page of `job`, `size` members at a time; fails the test on an
  // error. With `chunk` above 0 each page is built by a JobPageBuilder
  // `chunk` members per step, the steps counted in `steps`.
  std::vector<v1::JobStatus> AllPages(const std::string& job, int32_t size,
                                      int32_t chunk = 0, int* steps = nullptr) {
    std::vector<v1::JobStatus> pages;
    std::string token;
    do {
      absl::StatusOr<v1::JobStatus> page =
          chunk > 0 ? PageInChunks(job, size, token, chunk, steps)
                    : Page(job, size, token);
      EXPECT_TRUE(page.ok()) << page.status();
      if (!page.ok() || pages.size() > 1000) break;
      token = page->next_page_token();
      pages.push_back(*std::move(page));
    } while (!token.empty());
    return pages;
  }

  // Pages compared whole, each field of every member included.
  static std::vector<std::string> Serialized(
      const std::vector<v1::JobStatus>& pages) {
    std::vector<std::string> serialized;
    for (const v1::JobStatus& page : pages) {
      serialized.push_back(page.SerializeAsString());
    }
    return serialized;
  }

  static std::vector<std::string> Names(
      const std::vector<v1::JobStatus>& pages) {
    std::vector<std::string> names;
    for (const v1::JobStatus& page : pages) {
      for (const v1::MemberStatus& m : page.members()) {
        names.push_back(m.node_name());
      }
    }
    return names;
  }

  // `count` nodes named n0, n1, ... joined to a job that waits for more
  // (nothing is sealed, so nothing large is sent).
  std::vector<Agent> FormingJob(const std::string& job, int count) {
    std::vector<Agent> agents;
    for (int k = 0; k < count; ++k) {
      agents.push_back(Connect(absl::StrCat("n", k)));
      Join(agents.back(), job, 1, count + 1);
    }
    return agents;
  }
};

TEST_F(CoordinatorPagingTest, PagesHoldEveryMemberOnceInRankOrder) {
  std::vector<Agent> agents = JoinNodes("job", std::vector<int>(25, 2));
  ASSERT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);
  const v1::JobStatus whole = Status("job");
  std::vector<std::string> by_rank;
  for (const v1::MemberStatus& m : whole.members()) {
    by_rank.push_back(m.node_name());
  }

  const std::vector<v1::JobStatus> pages = AllPages("job", 7);
  ASSERT_THAT(pages, SizeIs(4));
  EXPECT_THAT(pages[0].members(), SizeIs(7));
  EXPECT_THAT(pages[3].members(), SizeIs(4));
  EXPECT_EQ(Names(pages), by_rank);
  int32_t rank = 0;
  for (const v1::JobStatus& page : pages) {
    // The job's own fields come whole with every page.
    EXPECT_EQ(page.total_members(), 25);
    EXPECT_EQ(page.generation(), 1);
    EXPECT_EQ(page.world_size(), 50);
    EXPECT_EQ(page.state(), v1::JOB_STATE_RUNNING);
    EXPECT_THAT(page.events(), Not(IsEmpty()));
    for (const v1::MemberStatus& m : page.members()) {
      EXPECT_EQ(m.node_rank(), rank++);
      // Per-member step fields are filled on every page, not just the first.
      EXPECT_THAT(m.ranks(), SizeIs(2)) << m.node_name();
    }
  }
  EXPECT_THAT(pages.back().next_page_token(), IsEmpty());
  // A page size of at least the members: one page, no token.
  EXPECT_THAT(AllPages("job", 25), SizeIs(1));
  EXPECT_EQ(whole.total_members(), 25);
  EXPECT_THAT(whole.next_page_token(), IsEmpty());
}

TEST_F(CoordinatorPagingTest,
       UnsealedMembersComeByNameAndPagesSkipNoneThatLeave) {
  std::vector<Agent> agents = FormingJob("job", 12);
  absl::StatusOr<v1::JobStatus> first = Page("job", 5);
  ASSERT_TRUE(first.ok()) << first.status();
  // n0, n1, n10, n11, n2: by name.
  EXPECT_EQ(first->members(2).node_name(), "n10");
  EXPECT_EQ(first->members(4).node_name(), "n2");
  // The last member of the page and one after it leave before the next
  // page: the next page starts after n2 all the same.
  coordinator_->OnSessionClosed(agents[2].id, "gone");
  coordinator_->OnSessionClosed(agents[3].id, "gone");
  std::vector<std::string> rest;
  std::string token = first->next_page_token();
  while (!token.empty()) {
    absl::StatusOr<v1::JobStatus> page = Page("job", 5, token);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const v1::MemberStatus& m : page->members()) {
      rest.push_back(m.node_name());
    }
    token = page->next_page_token();
  }
  EXPECT_EQ(rest,
            (std::vector<std::string>{"n4", "n5", "n6", "n7", "n8", "n9"}));
}

// A re-forming job holds both kinds: the survivors keep their node ranks and
// come first, the newcomers follow by name, and a page may start or end on
// either side of the border.
TEST_F(CoordinatorPagingTest, PagesCrossFromSealedToUnsealedMembers) {
  std::vector<Agent> agents;
  for (int k = 0; k < 6; ++k) {
    agents.push_back(Connect(absl::StrCat("n", k)));
    Join(agents.back(), "job", 1, 6, /*min_nodes=*/6);
  }
  ASSERT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);
  for (int k = 1; k <= 4; ++k) {
    coordinator_->OnSessionClosed(agents[k].id, "crashed");
  }
  for (const char* node : {"z9", "a9", "m9"}) {
    agents.push_back(Connect(node));
    Join(agents.back(), "job", 1, 6, /*min_nodes=*/6);
  }
  const v1::JobStatus whole = Status("job");
  ASSERT_EQ(whole.state(), v1::JOB_STATE_REFORMING);
  const std::vector<std::string> order = {"n0", "n5", "a9", "m9", "z9"};
  EXPECT_EQ(Names({whole}), order);
  EXPECT_EQ(whole.members(1).node_rank(), 5);
  EXPECT_EQ(whole.members(2).node_rank(), -1);
  for (int32_t size = 1; size <= 6; ++size) {
    const std::vector<v1::JobStatus> pages = AllPages("job", size);
    EXPECT_EQ(Names(pages), order) << "page size " << size;
    EXPECT_THAT(pages, SizeIs((5 + size - 1) / size)) << "page size " << size;
    for (const v1::JobStatus& page : pages) {
      EXPECT_EQ(page.total_members(), 5);
    }
  }
  // A newcomer that leaves between pages shifts nothing.
  absl::StatusOr<v1::JobStatus> first = Page("job", 3);
  ASSERT_TRUE(first.ok()) << first.status();
  coordinator_->OnSessionClosed(agents[7].id, "gone");  // a9, the page's last
  absl::StatusOr<v1::JobStatus> next = Page("job", 3, first->next_page_token());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(Names({*next}), (std::vector<std::string>{"m9", "z9"}));
  EXPECT_EQ(next->total_members(), 4);
}

TEST_F(CoordinatorPagingTest, PageSizeDefaultsAndIsCappedAtTheMaximum) {
  FormingJob("big", MemberPage::kMaxSize + 1);
  absl::StatusOr<v1::JobStatus> page = Page("big", 0);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(page->members(), SizeIs(MemberPage::kDefaultSize));
  EXPECT_THAT(page->next_page_token(), Not(IsEmpty()));
  EXPECT_EQ(page->total_members(), MemberPage::kMaxSize + 1);

  page = Page("big", 100000);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(page->members(), SizeIs(MemberPage::kMaxSize));
  page = Page("big", 100000, page->next_page_token());
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(page->members(), SizeIs(1));
  EXPECT_THAT(page->next_page_token(), IsEmpty());

  page = Page("big", -1);
  EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(page.status().message(), AllOf(HasSubstr("page_size is -1"),
                                             HasSubstr("0 for the default")));
}

// Status.ListJobs gives each job its first page; GetJob goes on from its
// token. The coordinator's own ListJobs() (metrics) still has every member.
TEST_F(CoordinatorPagingTest, ListJobsGivesEachJobItsFirstPage) {
  FormingJob("big", MemberPage::kDefaultSize + 3);
  for (const char* node : {"s0", "s1"}) {
    Agent agent = Connect(node);
    Join(agent, "small", 1, 2);
  }
  const v1::ListJobsResponse listed =
      coordinator_->ListJobs(v1::ListJobsRequest());
  ASSERT_THAT(listed.jobs(), SizeIs(2));
  const v1::JobStatus& big = listed.jobs(0);
  EXPECT_EQ(big.job(), "big");
  EXPECT_THAT(big.members(), SizeIs(MemberPage::kDefaultSize));
  EXPECT_EQ(big.total_members(), MemberPage::kDefaultSize + 3);
  EXPECT_EQ(big.world_size(), MemberPage::kDefaultSize + 3);
  const v1::JobStatus& small = listed.jobs(1);
  EXPECT_EQ(small.job(), "small");
  EXPECT_THAT(small.members(), SizeIs(2));
  EXPECT_THAT(small.next_page_token(), IsEmpty());

  absl::StatusOr<v1::JobStatus> rest = Page("big", 0, big.next_page_token());
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_THAT(rest->members(), SizeIs(3));
  EXPECT_THAT(rest->next_page_token(), IsEmpty());
  std::vector<std::string> names = Names({big, *rest});
  EXPECT_EQ(names, Names({Status("big")}));

  const v1::ListJobsResponse whole = coordinator_->ListJobs();
  ASSERT_THAT(whole.jobs(), SizeIs(2));
  EXPECT_THAT(whole.jobs(0).members(), SizeIs(MemberPage::kDefaultSize + 3));
  EXPECT_THAT(whole.jobs(0).next_page_token(), IsEmpty());
}

TEST_F(CoordinatorPagingTest, APageEndsEarlyWhenItsMembersAreLarge) {
  std::vector<Agent> agents = JoinNodes("job", std::vector<int>(8, 1));
  // Half a MiB of tensor latencies per node.
  for (Agent& agent : agents) {
    v1::AgentMessage message;
    v1::StepReport* report = message.mutable_step_report();
    report->set_job("job");
    report->set_generation(1);
    for (uint32_t id = 0; id < 30000; ++id) {
      v1::TensorLatency* l = report->mutable_stats()->add_tensor_latencies();
      l->set_tensor_id(id);
      l->set_count(1000);
      l->set_mean_us(100000);
      l->set_max_us(100000);
    }
    Send(agent, message);
  }
  const std::vector<v1::JobStatus> pages = AllPages("job", 8);
  ASSERT_GT(pages.size(), 1u);
  for (const v1::JobStatus& page : pages) {
    EXPECT_LE(page.ByteSizeLong(), MemberPage::kMaxBytes + (1 << 20));
  }
  EXPECT_THAT(Names(pages), SizeIs(8));
  EXPECT_EQ(Names(pages), Names({Status("job")}));
  // Built a chunk at a time, the pages end at the same members.
  int steps = 0;
  EXPECT_EQ(Serialized(AllPages("job", 8, 3, &steps)), Serialized(pages));
}

TEST_F(CoordinatorPagingTest, APageBuiltInChunksIsThePageBuiltAtOnce) {
  std::vector<Agent> agents = JoinNodes("job", std::vector<int>(25, 2));
  for (const int32_t size : {1, 7, 25, 0}) {
    for (const int32_t chunk : {1, 3, 250}) {
      int steps = 0;
      const std::vector<v1::JobStatus> chunked =
          AllPages("job", size, chunk, &steps);
      EXPECT_EQ(Serialized(chunked),
                Serialized(AllPages("job", size == 0 ? 1000 : size)))
          << "pages of " << size << ", chunks of " << chunk;
      // One step per chunk: the last page's may be short.
      const int32_t page = size == 0 ? 25 : size;
      const int32_t chunks_per_page = (std::min(page, 25) + chunk - 1) / chunk;
      EXPECT_LE(steps, static_cast<int>(chunked.size()) * chunks_per_page)
          << "pages of " << size << ", chunks of " << chunk;
      EXPECT_GE(steps, static_cast<int>(chunked.size()));
    }
  }
}

TEST_F(CoordinatorPagingTest, AJobThatChangesBetweenChunksGetsItsPageAgain) {
  std::vector<Agent> agents = JoinNodes("job", {1, 1, 1, 1});
  v1::GetJobRequest request;
  request.set_job("job");
  JobPageBuilder builder(request, /*chunk_members=*/1);
  ASSERT_FALSE(builder.Step(*coordinator_));
  // n3 is lost between two chunks: generation 1 ends, and the page is
  // built again from its start, of the re-forming job.
  coordinator_->OnSessionClosed(agents[3].id, "crashed");
  int steps = 1;
  while (!builder.Step(*coordinator_) && steps < 100) ++steps;
  absl::StatusOr<v1::JobStatus> page = builder.Take();
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->SerializeAsString(), Status("job").SerializeAsString());
  EXPECT_NE(page->state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(page->members(), SizeIs(3));
}

TEST_F(CoordinatorPagingTest, AChunkedPageRefusesWhatThePageAtOnceRefuses) {
  JoinNodes("job", {1, 1});
  v1::GetJobRequest request;
  request.set_job("job");
  request.set_page_token("not a token!");
  JobPageBuilder bad_token(request, 1);
  EXPECT_TRUE(bad_token.Step(*coordinator_));
  EXPECT_EQ(bad_token.Take().status().code(),
            absl::StatusCode::kInvalidArgument);
  request.clear_page_token();
  request.set_job("unknown");
  JobPageBuilder unknown(request, 1);
  EXPECT_TRUE(unknown.Step(*coordinator_));
  EXPECT_EQ(unknown.Take().status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorPagingTest, RefusesTokensItDidNotIssueForTheJob) {
  JoinNodes("job", {1, 1, 1});
  JoinNodes("other", {1, 1});
  for (const std::string& token :
       {std::string("not a token!"), absl::WebSafeBase64Escape("m1:1:2"),
        absl::WebSafeBase64Escape("m1:x:2:0:3:jobn0"),
        absl::WebSafeBase64Escape("m1:1:2:0:99:jobn0")}) {
    absl::StatusOr<v1::JobStatus> page = Page("job", 1, token);
    EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument)
        << token;
    EXPECT_THAT(page.status().message(),
                AllOf(HasSubstr("page_token \"" + token.substr(0, 20)),
                      HasSubstr("ask for the first page again")));
  }
  absl::StatusOr<v1::JobStatus> other = Page("other", 1);
  ASSERT_TRUE(other.ok()) << other.status();
  absl::StatusOr<v1::JobStatus> page = Page("job", 1, other->next_page_token());
  EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(page.status().message(),
              HasSubstr("a page token of job \"other\", not of job \"job\""));
}

TEST_F(CoordinatorPagingTest, ATokenFromAnotherGenerationIsAborted) {
  std::vector<Agent> agents = JoinNodes("job", {1, 1, 1});
  absl::StatusOr<v1::JobStatus> first = Page("job", 2);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_THAT(first->next_page_token(), Not(IsEmpty()));
  // n2 is lost: generation 1 ends.
  coordinator_->OnSessionClosed(agents[2].id, "crashed");
  absl::StatusOr<v1::JobStatus> next = Page("job", 2, first->next_page_token());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(next.status().message(),
              AllOf(HasSubstr("members of job \"job\" changed"),
                    HasSubstr("it was generation 1, JOB_STATE_RUNNING"),
                    HasSubstr("fetch them again from the first page")));
  // Starting again works.
  EXPECT_TRUE(Page("job", 2).ok());
}

TEST_F(CoordinatorPagingTest, ATokenOfAFormingJobIsAbortedByTheSeal) {
  std::vector<Agent> agents;
  for (int k = 0; k < 3; ++k) {
    agents.push_back(Connect(absl::StrCat("n", k)));
    Join(agents.back(), "job", 1, 4);
  }
  absl::StatusOr<v1::JobStatus> first = Page("job", 2);
  ASSERT_TRUE(first.ok()) << first.status();
  agents.push_back(Connect("n3"));
  Join(agents.back(), "job", 1, 4);
  ASSERT_EQ(Status("job").state(), v1::JOB_STATE_RUNNING);
  // Same generation number, but the order changed from names to ranks.
  EXPECT_EQ(Page("job", 2, first->next_page_token()).status().code(),
            absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace baton::coordinator
