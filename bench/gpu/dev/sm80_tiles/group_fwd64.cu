#include "variants.cuh"
void add_fwd64(std::vector<Variant>& v) {
  FWD("128x128w4 (adopted)", 64, 0, 128, 128, 4);
  FWD("128x64w4 (adopted)", 64, 1, 128, 64, 4);
}
