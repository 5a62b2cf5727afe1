#include <tq/quantizer.h>
#include <cstdio>
int main() {
  tq::QuantizerConfig c; c.dim = 128; c.bits = 4;
  auto q = tq::make_quantizer(tq::QuantizerKind::mse, c);
  std::printf("%zu\n", q->code_bytes());
}
