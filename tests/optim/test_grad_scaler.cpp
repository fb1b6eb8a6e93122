// The dynamic loss scaler follows Colossal-AI's DynamicGradScaler step by step.
#include <gtest/gtest.h>

#include <cmath>

#include "cai/core/error.h"
#include "cai/optim/grad_scaler.h"

using namespace cai;
using namespace cai::optim;

TEST(GradScaler, DefaultsAreColossalAis) {
  DynamicGradScaler s;
  EXPECT_EQ(s.scale(), 65536.0);
  GradScalerConfig c;
  EXPECT_EQ(c.min_scale, 1.0);
  EXPECT_EQ(c.growth_factor, 2.0);
  EXPECT_EQ(c.backoff_factor, 0.5);
  EXPECT_EQ(c.growth_interval, 1000);
  EXPECT_EQ(c.hysteresis, 2);
  EXPECT_EQ(c.max_scale, 4294967296.0);
}

TEST(GradScaler, HysteresisThenBackoffAndSkippedSteps) {
  GradScalerConfig c;
  c.initial_scale = 1024, c.hysteresis = 2, c.growth_interval = 3;
  DynamicGradScaler s(c);
  std::string msg;
  EXPECT_TRUE(s.update(true, &msg));  // first overflow: skipped, scale kept
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_NE(msg.find("step skipped"), std::string::npos) << msg;
  EXPECT_TRUE(s.update(true, &msg));  // second: backs off
  EXPECT_EQ(s.scale(), 512);
  EXPECT_NE(msg.find("backed off to 512"), std::string::npos) << msg;
  EXPECT_TRUE(s.update(true));  // hysteresis not reset by a backoff: backs off again
  EXPECT_EQ(s.scale(), 256);
  // Three clean steps grow the scale and reset the hysteresis count.
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 256);
  EXPECT_FALSE(s.update(false, &msg));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.hysteresis_step(), 0);
  EXPECT_NE(msg.find("grown to 512"), std::string::npos);
  // An overflow resets the growth count.
  EXPECT_FALSE(s.update(false));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.growth_step(), 0);
  EXPECT_EQ(s.scale(), 512);
}

TEST(GradScaler, ClampsToMinAndMax) {
  GradScalerConfig c;
  c.initial_scale = 2, c.min_scale = 1, c.max_scale = 4, c.hysteresis = 1, c.growth_interval = 1;
  DynamicGradScaler s(c);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 1);
  for (int i = 0; i < 5; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 4);
  GradScalerConfig bad;
  bad.backoff_factor = 1.5;
  EXPECT_THROW(DynamicGradScaler{bad}, Error);
}

TEST(GradScaler, DetectsOverflowAndUnscales) {
  auto p = nn::make_parameter("w", {3}, true);
  p.grad = Tensor::from_vector(std::vector<float>{2, 4, 8}, {3});
  std::vector<nn::Parameter*> ps{&p};
  EXPECT_TRUE(grads_finite(ps));
  GradScalerConfig c;
  c.initial_scale = 4;
  DynamicGradScaler s(c);
  s.unscale(ps);
  EXPECT_EQ(p.grad.to_vector(), (std::vector<float>{0.5f, 1, 2}));
  p.grad.data<float>()[1] = INFINITY;
  EXPECT_FALSE(grads_finite(ps));
  p.grad.data<float>()[1] = NAN;
  EXPECT_FALSE(grads_finite(ps));
  DynamicGradScaler t;
  t.update(true);
  DynamicGradScaler u;
  u.load_state(t.state());
  EXPECT_EQ(u.hysteresis_step(), 1);
  EXPECT_THROW(u.load_state({1.0}), Error);
}

// trainer_state.json's loss_scaler as load_state takes it: what update() keeps true or an error
// naming the value (the loss_scaler_state fuzz target's first input was a growth step equal to a
// smaller growth_interval, which the scaler accepted and then never grew again).
TEST(GradScaler, LoadStateRefusesWhatUpdateNeverProduces) {
  GradScalerConfig c;
  c.min_scale = 1, c.initial_scale = 1024, c.max_scale = 65536, c.growth_interval = 3;
  DynamicGradScaler s(c);
  s.load_state({2048, 2, 5});
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_EQ(s.growth_step(), 2);
  EXPECT_EQ(s.hysteresis_step(), 5);
  s.update(false);  // the third clean step grows it
  EXPECT_EQ(s.scale(), 4096);
  auto refused = [&](std::vector<double> st, const char* says) {
    try {
      s.load_state(st);
      ADD_FAILURE() << "accepted " << st[0] << ", " << st[1] << ", " << st[2];
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused({INFINITY, 0, 0}, "saved loss scale inf is outside [min_scale 1, max_scale 65536]");
  refused({NAN, 0, 0}, "saved loss scale nan");
  refused({131072, 0, 0}, "saved loss scale 131072 is outside");
  refused({0.5, 0, 0}, "saved loss scale 0.5");
  refused({1024, 3, 0}, "saved growth step 3 must be a whole number in [0, growth_interval 3)");
  refused({1024, -1, 0}, "saved growth step -1");
  refused({1024, 1.5, 0}, "saved growth step 1.5");
  refused({1024, 0, 1e300}, "saved hysteresis step 1e+300 must be a whole number >= 0");
  refused({1024, 0, -2}, "saved hysteresis step -2");
  EXPECT_EQ(s.scale(), 4096);  // a refused state changes nothing
}
