// Small statistics every measurement path shares (benchmarks, trace timelines, the timing model).
#pragma once

#include <vector>

namespace megadecode {

// The median (the mean of the middle two for an even count); 0 for no samples.
double median(std::vector<double> samples);

}  // namespace megadecode
